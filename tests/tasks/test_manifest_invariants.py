"""One list of manifest invariants, checked two ways that must agree: ``formats.shards.
MANIFEST_INVARIANTS`` is the list, ``Manifest.broken()`` checks it in Python (``tokenlake shards
verify``), and ``expectations/shard_manifest.json`` checks it as the shard stage's Great
Expectations gate. Every mutation of a sound manifest below breaks the same invariants both ways."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from expectations import load_suite
from formats import layout
from formats.shards import HEADER_SIZE, MANIFEST_INVARIANTS, SHA256_HEX, Manifest, ShardEntry
from tasks.gates import Coverage, run_gate
from tasks.shard.stage import manifest_check

SUITE = load_suite("shard_manifest")


def _entry(source: str, index: int, sequences: int) -> ShardEntry:
    tokens = sequences * 4  # seq_len 3
    return ShardEntry(
        name=layout.shard_path(source, index),
        source=source,
        sha256=f"{index:02d}" * 32,
        sequences=sequences,
        tokens=tokens,
        bytes=HEADER_SIZE + 2 * tokens,
    )


def sound() -> Manifest:
    return Manifest.build(
        [_entry("web", 0, 5), _entry("web", 1, 4), _entry("code", 0, 3)],
        seq_len=3,
        dtype="uint16",
        vocab_size=300,
        eod_token=299,
        tokenizer_sha256="",
        input_commit="",
    )


def _with_entry(m: Manifest, i: int, **changes: object) -> Manifest:
    shards = list(m.shards)
    shards[i] = shards[i].model_copy(update=changes)
    return m.model_copy(update={"shards": shards})


MUTATIONS: dict[str, Callable[[Manifest], Manifest]] = {
    "has_shards": lambda m: m.model_copy(update={"shards": []}),
    "no_empty_shard": lambda m: _with_entry(m, 0, sequences=0, tokens=0, bytes=HEADER_SIZE),
    "balanced_sources": lambda m: Manifest.build(
        [_entry("web", 0, 5), _entry("web", 1, 2), _entry("code", 0, 3)], **m._fields()
    ),
    "unique_names": lambda m: _with_entry(m, 2, name=m.shards[1].name),
    "shard_paths": lambda m: _with_entry(m, 0, name="shards/code/part-0.bin"),
    "checksums": lambda m: _with_entry(m, 0, sha256="not-a-digest"),
    "tokens_per_sequence": lambda m: Manifest.build(
        [m.shards[0].model_copy(update={"tokens": 13, "bytes": HEADER_SIZE + 26}), *m.shards[1:]],
        **m._fields(),
    ),
    "file_sizes": lambda m: _with_entry(m, 0, bytes=m.shards[0].bytes + 1),
    "source_sequences": lambda m: m.model_copy(
        update={"sources": m.sources | {"code": {"sequences": 4, "tokens": 12}}}
    ),
    "source_tokens": lambda m: m.model_copy(
        update={"sources": m.sources | {"code": {"sequences": 3, "tokens": 13}}}
    ),
    "total_sequences": lambda m: m.model_copy(
        update={"totals": {"sequences": 13, "tokens": m.totals["tokens"]}}
    ),
    "total_tokens": lambda m: m.model_copy(update={"totals": {"sequences": 12, "tokens": 1}}),
    "sources_have_shards": lambda m: m.model_copy(
        update={"sources": m.sources | {"wiki": {"sequences": 0, "tokens": 0}}}
    ),
    "dtype_fits_vocabulary": lambda m: m.model_copy(update={"dtype": "uint32"}),
    "eod_in_vocabulary": lambda m: m.model_copy(update={"eod_token": 300}),
}


def test_the_suite_checks_exactly_the_listed_invariants_with_the_same_reasons():
    by_invariant = {e["meta"]["invariant"]: e["meta"]["why"] for e in SUITE["expectations"]}
    assert len(by_invariant) == len(SUITE["expectations"]), "one expectation per invariant"
    assert by_invariant == MANIFEST_INVARIANTS
    assert set(MUTATIONS) == set(MANIFEST_INVARIANTS), "every invariant has a mutation below"
    regex = {e["meta"]["invariant"]: e["kwargs"].get("regex") for e in SUITE["expectations"]}
    assert regex["shard_paths"] == layout.SHARD_PATH.pattern and regex["checksums"] == SHA256_HEX.pattern


def _gx_broken(manifest: Manifest) -> set[str]:
    outcome = run_gate(
        [manifest_check(manifest)], "shard-test", Coverage.everything(len(manifest.shards), "shards")
    )
    (suite,) = outcome.suites
    return {e["meta"]["invariant"] for e in suite["expectations"] if not e["success"]}


def test_a_sound_manifest_breaks_nothing_either_way():
    manifest = sound()
    assert manifest.broken() == [] and _gx_broken(manifest) == set()


@pytest.mark.parametrize("invariant", sorted(MUTATIONS))
def test_each_mutation_breaks_the_same_invariants_in_python_and_in_the_suite(invariant):
    manifest = MUTATIONS[invariant](sound())
    python = {name for name, _ in manifest.broken()}
    assert invariant in python
    assert _gx_broken(manifest) == python
