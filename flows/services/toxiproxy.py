"""toxiproxy on 127.0.0.1: TCP proxies in front of a service, with faults put on the wire.

The client speaks toxiproxy's own HTTP API (``/proxies``, ``/proxies/<name>/toxics``, ``/reset``);
a fault is a toxic (``latency``, ``bandwidth``, ``reset_peer``, ``timeout``, ...) on one direction
of a proxy, applied to a ``toxicity`` share of its connections, and an outage is a disabled proxy
(connections refused, open ones cut).
"""

from __future__ import annotations

import json
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.services.build import binary
from flows.services.process import ServiceProcess, free_port


@dataclass(frozen=True)
class Proxy:
    name: str
    listen_port: int
    upstream: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"


class ToxiproxyServer:
    def __init__(self, workdir: Path, *, port: int | None = None):
        self.port = port or free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.process = ServiceProcess(
            "toxiproxy",
            [str(binary("toxiproxy", "toxiproxy-server")), "-host", "127.0.0.1", "-port", str(self.port)],
            Path(workdir),
            ready=lambda: self._call("GET", "/version") is not None,
        )

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
        try:
            return json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return raw.decode()

    def proxy(self, name: str, upstream_port: int, *, listen_port: int | None = None) -> Proxy:
        """A proxy from a free loopback port (or ``listen_port``) to ``127.0.0.1:upstream_port``."""
        created = Proxy(name, listen_port or free_port(), f"127.0.0.1:{upstream_port}")
        self._call(
            "POST",
            "/proxies",
            {
                "name": name,
                "listen": f"127.0.0.1:{created.listen_port}",
                "upstream": created.upstream,
                "enabled": True,
            },
        )
        return created

    def add_toxic(
        self,
        proxy: Proxy,
        kind: str,
        attributes: dict[str, Any],
        *,
        name: str | None = None,
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> str:
        toxic = name or f"{kind}-{stream}"
        self._call(
            "POST",
            f"/proxies/{proxy.name}/toxics",
            {"name": toxic, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes},
        )
        return toxic

    def remove_toxic(self, proxy: Proxy, toxic: str) -> None:
        self._call("DELETE", f"/proxies/{proxy.name}/toxics/{toxic}")

    def set_enabled(self, proxy: Proxy, enabled: bool) -> None:
        """Disabled: new connections are refused and open ones are closed, as in a network outage."""
        self._call("POST", f"/proxies/{proxy.name}", {"enabled": enabled})

    @contextmanager
    def toxic(self, proxy: Proxy, kind: str, attributes: dict[str, Any], **options):
        toxic = self.add_toxic(proxy, kind, attributes, **options)
        try:
            yield toxic
        finally:
            self.remove_toxic(proxy, toxic)

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")

    def start(self) -> ToxiproxyServer:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> ToxiproxyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
