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
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.safety.config import BlocklistConfig
from tasks.stage import ConfigError


class BlocklistError(ConfigError):
    """A blocklist file that cannot be read; the message names it."""


SIMPLE_URL = r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?//(?P<host>[A-Za-z0-9._-]*)(?::[0-9]*)?(?:[/?#][\x21-\x7e]*)?$"
"""URLs whose host Arrow reads as urlsplit would (ASCII, no user info, no brackets, no escapes);
the rest are read in Python."""


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

    def match_batch(self, metas: pa.Array) -> tuple[dict[int, tuple[str, str]], int]:
        """``({index: (url, entry)} of the blocked documents, documents without a URL)`` of a
        batch's meta column: the URLs and their hosts are read and looked up by Arrow (a host or
        parent on a domain list gives its entry there), and only the documents whose host has
        a path-prefix entry, or whose URL is unusual, are matched in Python."""
        key = json.dumps(self.url_key)
        urls = pc.struct_field(pc.extract_regex(metas, re.escape(key) + r':\s*"(?P<url>[^"\\]*)"'), "url")
        plain = pc.and_(pc.greater(pc.utf8_length(urls), 0), pc.equal(pc.count_substring(metas, "{"), 1))
        plain = plain.fill_null(False)
        urls = pc.if_else(plain, urls, pa.scalar(None, pa.string()))
        unread = np.flatnonzero(
            np.asarray(pc.and_kleene(pc.invert(plain), pc.match_substring(metas, key)).fill_null(False), bool)
        )
        host = pc.struct_field(pc.extract_regex(urls, SIMPLE_URL), "host")
        host = pc.replace_substring_regex(pc.utf8_lower(host), r"\.+$", "")
        host = pc.replace_substring_regex(host, r"^www\.", "")
        listed = pc.is_in(host, value_set=pa.array(sorted(self.prefixes), pa.string())).fill_null(False)
        domains = pa.array(sorted(self.domains), pa.string())
        parent = pa.nulls(len(metas), pa.string())  # the longest listed parent, as match() finds it
        for dots in sorted({d.count(".") for d in self.domains}, reverse=True):
            candidate = pc.struct_field(pc.extract_regex(host, rf"(?P<p>[^.]*(?:\.[^.]*){{{dots}}})$"), "p")
            found = pc.is_in(candidate, value_set=domains).fill_null(False)
            parent = pc.if_else(pc.and_(found, pc.is_null(parent)), candidate, parent)
        odd = pc.and_(pc.is_valid(urls), pc.is_null(host))
        by_domain = np.asarray(pc.is_valid(parent), bool)
        check = np.asarray(pc.or_(listed, odd).fill_null(False), bool) & ~by_domain
        candidates = sorted({*np.flatnonzero(check).tolist(), *unread.tolist()})
        with_url = int(pc.sum(pc.cast(plain, pa.int64())).as_py() or 0)
        blocked: dict[int, tuple[str, str]] = {}
        for index in np.flatnonzero(by_domain).tolist():
            name = parent[index].as_py()
            blocked[index] = (urls[index].as_py(), f"{self.domains[name]}: {name}")
        for index in candidates:
            url = urls[index].as_py() if plain[index].as_py() else self.url_of(metas[index].as_py())
            with_url += int(url is not None and not plain[index].as_py())
            entry = None if url is None else self.match(url)
            if entry is not None:
                blocked[index] = (url, entry)
        return dict(sorted(blocked.items())), len(metas) - with_url

    def url_of(self, meta: str | None) -> str | None:
        if not meta:
            return None
        try:
            value = json.loads(meta).get(self.url_key)
        except (json.JSONDecodeError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None
