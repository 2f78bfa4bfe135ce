"""lakeFS on MinIO on 127.0.0.1: the server the tests use, started for a user without Docker.

    ./dev lakefs [--dir DIR] [--port 8000]

starts MinIO and lakeFS (built by ``./dev services``), lakeFS with its embedded KV store and MinIO
as its S3 blockstore, sets lakeFS up with generated admin keys and writes them to
``DIR/lakectl.yaml`` (readable by its owner only; lakectl reads the same file), then prints the
two variables to export and waits until Ctrl-C. The keys are never printed. ``DIR`` keeps the
data: started again on the same ``DIR`` and port, lakeFS finds its repositories (the keys of the
first start stay valid).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import yaml

from flows.services.build import build, load_pins
from flows.services.lakefs import Environment, LakeFSCredentials, LakeFSServer
from flows.services.minio import MinIOServer
from flows.services.toxiproxy import ToxiproxyServer

DEFAULT_DIR = Path.home() / ".local/share/tokenlake/lakefs"


class LakeFSOnS3:
    """MinIO, then lakeFS with MinIO as its blockstore; stopped in the reverse order.

    ``saved``: what :meth:`state` returned for an earlier start on ``workdir`` (its ports and
    keys), so that lakeFS finds its repositories and the keys stay valid. ``toxiproxy``: a
    started toxiproxy to put on the wire: lakeFS then reaches MinIO through its proxy ``s3``, and
    :attr:`client_endpoint` is its proxy ``lakefs`` in front of lakeFS (faults go on either)."""

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        saved: dict | None = None,
        toxiproxy: ToxiproxyServer | None = None,
    ):
        self.workdir = Path(workdir)
        self.toxiproxy = toxiproxy
        saved = saved or {}
        self.minio = MinIOServer(
            self.workdir / "minio",
            port=saved.get("s3_port"),
            keys=tuple(saved["s3_keys"]) if saved else None,
        )
        s3 = self.minio.endpoint
        self.s3_proxy = self.lakefs_proxy = None
        if toxiproxy is not None:
            self.s3_proxy = toxiproxy.proxy("s3", self.minio.port)
            s3 = replace(s3, url=self.s3_proxy.url)
        self.lakefs = LakeFSServer(
            self.workdir / "lakefs",
            s3=s3,
            port=saved.get("port", port),
            settings={"bucket": self.minio.bucket},
            keys=tuple(saved["lakefs_keys"]) if saved else None,
        )
        if toxiproxy is not None:
            self.lakefs_proxy = toxiproxy.proxy("lakefs", self.lakefs.port)

    @property
    def client_endpoint(self) -> str:
        """Where clients reach lakeFS: through the ``lakefs`` proxy when there is one."""
        return self.lakefs_proxy.url if self.lakefs_proxy is not None else self.lakefs.endpoint

    def lakectl_environment(self) -> Environment:
        """What tokenlake reads to reach lakeFS (through the proxy, if any) and where its repositories go."""
        credentials = replace(self.lakefs.credentials, endpoint=self.client_endpoint)
        return Environment(
            credentials.lakectl_environment(),
            TOKENLAKE_LAKEFS_STORAGE_NAMESPACE=self.lakefs.storage_namespace(),
        )

    def state(self) -> dict:
        endpoint = self.minio.endpoint
        return {
            "port": self.lakefs.port,
            "s3_port": self.minio.port,
            "s3_keys": [endpoint.access_key_id, endpoint.secret_access_key],
            "lakefs_keys": list(self.lakefs.keys),
        }

    def start(self) -> LakeFSOnS3:
        pins = load_pins()
        for name in ("minio", "lakefs"):
            build(pins[name], say=lambda line: None)  # waits for a build already under way
        self.minio.start()
        try:
            self.lakefs.start()
        except BaseException:
            self.minio.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.lakefs.stop()
        finally:
            self.minio.stop()

    def __enter__(self) -> LakeFSOnS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


def prepared(workdir: Path, port: int | None) -> LakeFSOnS3:
    """The stack of ``workdir``, on its first start's ports and keys if it has been started."""
    state = workdir / "state.json"
    if not state.exists():
        return LakeFSOnS3(workdir, port=port)
    saved = json.loads(state.read_text())
    if port is not None and port != saved["port"]:
        raise SystemExit(
            f"{workdir} holds a lakeFS that ran on port {saved['port']}: pass --port {saved['port']} or another --dir"
        )
    return LakeFSOnS3(workdir, saved=saved)


def write_lakectl_config(path: Path, credentials: LakeFSCredentials) -> None:
    config = {
        "server": {"endpoint_url": credentials.endpoint},
        "credentials": {
            "access_key_id": credentials.access_key_id,
            "secret_access_key": credentials.secret_access_key,
        },
    }
    _write_private(path, yaml.safe_dump(config, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev lakefs", description="Start lakeFS on MinIO on 127.0.0.1 until Ctrl-C."
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"data, keys and logs (default {DEFAULT_DIR})"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="lakeFS's port (default: a free one, then kept)"
    )
    args = parser.parse_args(argv)
    workdir = args.dir.expanduser().resolve()
    stack = prepared(workdir, args.port)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    with stack:
        _write_private(workdir / "state.json", json.dumps(stack.state()))
        lakectl = workdir / "lakectl.yaml"
        write_lakectl_config(lakectl, stack.lakefs.credentials)
        print(
            f"lakeFS v{load_pins()['lakefs'].version.lstrip('v')} on {stack.lakefs.endpoint} (MinIO on {stack.minio.endpoint.url}); keys in {lakectl}"
        )
        print("in another shell:")
        print(f"  export LAKECTL_CONFIG_FILE={lakectl}")
        print(f"  export TOKENLAKE_LAKEFS_STORAGE_NAMESPACE={stack.lakefs.storage_namespace()}")
        print("  tokenlake --repo lakefs://datasets curate ...")
        print("Ctrl-C stops both.", flush=True)
        stopping.wait()
    print("stopped")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DO_NOT_TRACK", "1")
    raise SystemExit(main())
