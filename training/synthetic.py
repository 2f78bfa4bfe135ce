"""A synthetic dataset commit (shards, manifest, mix) for tests, benchmarks and GPU checks.

Sequences are learnable, not pure noise: each is an arithmetic progression modulo the
vocabulary (random start, stride 1..16) with a share of tokens replaced at random, so a
small model's loss falls well below ``ln(vocab)`` and a spike stands out. The commit has
the layout of a published dataset (DESIGN.md section 3): ``shards/<source>/shard-NNNNN.bin``,
``shards/manifest.json`` and ``mix.json``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from formats import layout
from formats.mix import MixSpec, resolve_mix
from formats.shards import Manifest, ShardEntry, dtype_for_vocab, shard_bytes
from versioning import DataRepo


def synthetic_sequences(
    count: int, seq_len: int, vocab_size: int, seed: int, noise: float = 0.1
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab_size, size=(count, 1))
    stride = rng.integers(1, 17, size=(count, 1))
    rows = (start + stride * np.arange(seq_len + 1)) % vocab_size
    noisy = rng.random(rows.shape) < noise
    rows[noisy] = rng.integers(0, vocab_size, size=int(noisy.sum()))
    return rows.astype(dtype_for_vocab(vocab_size))


def publish_synthetic_dataset(
    repo: DataRepo,
    branch: str,
    sources: dict[str, int],
    seq_len: int = 32,
    vocab_size: int = 256,
    shards_per_source: int = 2,
    total_samples: int | None = None,
    seed: int = 0,
    weights: dict[str, float] | None = None,
) -> str:
    """Write and commit a dataset on ``branch`` (created from main if absent); returns the commit id.

    ``sources`` maps a source name to its sequence count; ``total_samples`` is the mix's
    budget in samples (default: one pass over every source).
    """
    if branch not in repo.list_branches():
        repo.create_branch(branch, layout.MAIN)
    eod = vocab_size - 1
    entries = []
    for k, (name, count) in enumerate(sorted(sources.items())):
        rows = synthetic_sequences(count, seq_len, vocab_size, seed=seed * 1000 + k)
        for i, part in enumerate(np.array_split(rows, shards_per_source)):
            path = layout.shard_path(name, i)
            data = shard_bytes(part, eod)
            repo.put(branch, path, data)
            entries.append(
                ShardEntry(
                    name=path,
                    source=name,
                    sha256=hashlib.sha256(data).hexdigest(),
                    sequences=len(part),
                    tokens=part.size,
                    bytes=len(data),
                    documents=int((part == eod).sum()),
                )
            )
    manifest = Manifest.build(
        entries,
        seq_len=seq_len,
        dtype=dtype_for_vocab(vocab_size).name,
        vocab_size=vocab_size,
        eod_token=eod,
        tokenizer_sha256="",
        input_commit="",
    )
    total = sum(sources.values())
    budget = total_samples or total
    spec = MixSpec(weights=weights, max_epochs=max(4.0, 2.0 * budget / min(sources.values())), seed=seed)
    plan = resolve_mix(spec, manifest.sources, seq_len, total_tokens=budget * seq_len)
    repo.put(branch, layout.MANIFEST, manifest.to_json().encode())
    repo.put(branch, layout.MIX, plan.to_json().encode())
    return repo.commit(
        branch, f"synthetic dataset: {total} sequences of {seq_len} tokens", {"stage": "synthetic"}
    ).id
