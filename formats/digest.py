"""The sha256 of a file, as the manifests record it (a shard's in ``shards/manifest.json``, a
checkpoint file's in its ``COMPLETE``): one definition for everything that checks a file
against its manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
