"""Re-read every shard of a dataset version and check it against its manifest.

Checked per shard (see :func:`formats.shards.verify_shard`): header, size, sha256, the EOD
count and placement (no adjacent EODs, within and across the shards of a source; a source
never starts with EOD) and token ids inside the vocabulary. Also checked: the manifest's own
consistency, the tokenizer's sha256, and shard files that the manifest does not list.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from formats import layout
from formats.shards import Manifest, ShardCheck, verify_shard
from versioning import DataRepo, NotFound


@dataclass
class ShardsVerification:
    ref: str
    commit_id: str
    checks: list[ShardCheck] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # shard name -> source

    @property
    def faulty(self) -> list[ShardCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and not self.faulty

    def rows(self) -> list[dict[str, object]]:
        return [
            {
                "name": c.name,
                "source": self.sources.get(c.name, ""),
                "sequences": c.sequences,
                "documents": c.documents,
                "bytes": c.bytes,
                "status": "ok" if c.ok else "FAULT: " + "; ".join(c.faults),
            }
            for c in self.checks
        ]


def verify_shards_at(
    repo: DataRepo, ref: str, on_shard: Callable[[int, int], None] | None = None
) -> ShardsVerification:
    """Verify the manifest, tokenizer and every shard at ``ref``; faults are collected, not raised.

    ``on_shard(done, total)`` is called after each shard (for progress bars).
    """
    commit_id = repo.resolve(ref)
    result = ShardsVerification(ref, commit_id)
    manifest_check = ShardCheck(layout.MANIFEST)
    result.checks.append(manifest_check)
    try:
        raw = repo.get(commit_id, layout.MANIFEST)
        manifest_check.bytes = len(raw)
        manifest = Manifest.from_json(raw)
    except NotFound:
        manifest_check.faults.append(f"no {layout.MANIFEST} at {ref}: this version has no shards")
        return result
    except ValueError as exc:
        manifest_check.faults.append(f"unreadable manifest: {str(exc).splitlines()[0]}")
        return result
    manifest_check.faults += manifest.faults()
    manifest_check.sequences = manifest.totals["sequences"]
    manifest_check.documents = sum(e.documents for e in manifest.shards)
    result.checks.append(_check_tokenizer(repo, commit_id, manifest))

    listed = {e.name for e in manifest.shards}
    previous_token: dict[str, int | None] = {}
    for done, entry in enumerate(manifest.shards, 1):
        starts_source = entry.source not in previous_token
        try:
            with repo.open(commit_id, entry.name) as stream:
                check = verify_shard(
                    stream, entry.name, entry, manifest, previous_token.get(entry.source), starts_source
                )
        except NotFound:
            check = ShardCheck(entry.name, faults=["missing: the manifest lists it but the file is absent"])
        previous_token[entry.source] = check.last_token
        result.sources[entry.name] = entry.source
        result.checks.append(check)
        if on_shard is not None:
            on_shard(done, len(manifest.shards))
    for obj in repo.list(commit_id, f"{layout.SHARDS}/"):
        if obj.path != layout.MANIFEST and obj.path not in listed:
            result.checks.append(ShardCheck(obj.path, bytes=obj.size, faults=["not listed in the manifest"]))
    return result


def _check_tokenizer(repo: DataRepo, commit_id: str, manifest: Manifest) -> ShardCheck:
    check = ShardCheck(layout.TOKENIZER)
    try:
        data = repo.get(commit_id, layout.TOKENIZER)
    except NotFound:
        check.faults.append("missing: the shards cannot be decoded without their tokenizer")
        return check
    check.bytes = len(data)
    if hashlib.sha256(data).hexdigest() != manifest.tokenizer_sha256:
        check.faults.append("sha256 differs from the manifest's tokenizer_sha256")
    return check
