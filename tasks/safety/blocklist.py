"""URL blocklists: a document whose URL (``meta[url_key]``) is on a list is quarantined as
``blocked_url``.

A ``domains`` entry blocks the host and every subdomain (``example.com`` blocks
``a.b.example.com``, not ``badexample.com``); a ``urls`` entry ``host/path`` blocks that host
and every URL whose path starts with the prefix at a segment boundary (``example.org/private``
blocks ``/private`` and ``/private/x``, not ``/privateer``). Hosts are compared lower-cased,
without port, trailing dot or a leading ``www.``; the scheme is ignored. Documents without a
URL are not checked (counted as ``no_url`` in the report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tasks.safety.config import BlocklistConfig
from tasks.stage import ConfigError


class BlocklistError(ConfigError):
    """A blocklist file that cannot be read; the message names it."""


def _host_and_path(url: str) -> tuple[str, str]:
    parts = urlsplit(url if "//" in url else "//" + url)
    host = (parts.hostname or "").rstrip(".").removeprefix("www.")
    return host, parts.path or "/"


def list_entries(path: Path) -> list[str]:
    """The entries of a list file: one a line, blank lines and ``#`` comments skipped; a hosts-file
    line (``0.0.0.0 example.com``) gives its last word."""
    if not path.is_file():
        raise BlocklistError(f"blocklist file {path} does not exist")
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            entries.append(line.split()[-1].lower())
    return entries


@dataclass
class Blocklist:
    """Every configured list: ``domains`` host -> list name, ``prefixes`` host -> (path, list name)."""

    url_key: str = "url"
    domains: dict[str, str] = field(default_factory=dict)
    prefixes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    facts: dict[str, dict[str, object]] = field(default_factory=dict)

    @classmethod
    def load(cls, config: BlocklistConfig) -> Blocklist:
        blocklist = cls(url_key=config.url_key)
        for listed in config.lists:
            entries = list_entries(Path(listed.path))
            for entry in entries:
                host, path = _host_and_path(entry.removeprefix("*."))
                if not host:
                    continue
                if listed.kind == "domains":
                    blocklist.domains.setdefault(host, listed.name)
                else:
                    blocklist.prefixes.setdefault(host, []).append((path.rstrip("/") or "/", listed.name))
            blocklist.facts[listed.name] = {"kind": listed.kind, "entries": len(entries)}
        return blocklist

    @property
    def empty(self) -> bool:
        return not self.domains and not self.prefixes

    def match(self, url: str) -> str | None:
        """``"<list>: <entry>"`` when ``url`` is blocked, else None."""
        host, path = _host_and_path(url)
        labels = host.split(".")
        for i in range(len(labels)):
            parent = ".".join(labels[i:])
            if parent in self.domains:
                return f"{self.domains[parent]}: {parent}"
        for prefix, name in self.prefixes.get(host, ()):
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return f"{name}: {host}{prefix}"
        return None

    def url_of(self, meta: str | None) -> str | None:
        if not meta:
            return None
        try:
            value = json.loads(meta).get(self.url_key)
        except (json.JSONDecodeError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None
