"""A small published dataset version with a real tokenizer: generated text, a BPE trained on it
(tasks.tokenize), documents encoded by tokenlake's encoder and packed into shards, published into
main the way the curate flow publishes (stage commits, a merge with the stage chain, a tag)."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from flows.wap import ChainLink, PublishedVersion, publish, run_branch
from formats import layout
from formats.mix import MixSpec, resolve_mix
from formats.shards import Manifest, ShardEntry, dtype_for_vocab, shard_bytes
from tasks.tokenize import BatchEncoder, train_tokenizer
from versioning import DataRepo

SEQ_LEN = 32
EOD = "<|endoftext|>"
SPECIALS = [EOD, "<|pad|>"]
WORDS = [
    "the",
    "a",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "data",
    "model",
    "token",
    "lake",
    "shard",
    "commit",
    "train",
]


def documents(source: str, count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    if source == "code":
        return [f"def f{i}(x):\n    return x * {int(rng.integers(100))} + {i}\n" for i in range(count)]
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 14)))) + "." for _ in range(count)]


def publish_tokenized_version(repo: DataRepo, flow_run_id: str, seed: int) -> PublishedVersion:
    branch = run_branch(flow_run_id)
    main = repo.create_branch(branch, layout.MAIN)
    texts = {"web": documents("web", 240, seed), "code": documents("code", 160, seed + 1)}
    report = {
        "stage": "ingest",
        "per_source": {n: {"documents_in": len(t), "kept": len(t)} for n, t in texts.items()},
    }
    repo.put(branch, layout.report_path("ingest"), json.dumps(report).encode())
    ingest = repo.commit(branch, "ingest", _meta("ingest", main, flow_run_id), allow_empty=True).id
    dedup_report = {
        "stage": "dedup",
        "per_source": {n: {"documents_in": len(t), "kept": len(t)} for n, t in texts.items()},
    }
    repo.put(branch, layout.report_path("dedup"), json.dumps(dedup_report).encode())
    dedup = repo.commit(branch, "dedup", _meta("dedup", ingest, flow_run_id), allow_empty=True).id

    # 300 tokens: the model's vocabulary is padded to 320, so the export carries rows no token has
    tokenizer = train_tokenizer([t for group in texts.values() for t in group], 300, SPECIALS)
    tokenizer_json = tokenizer.to_str()
    encoder = BatchEncoder.load(tokenizer_json, "tiktoken")
    eod = tokenizer.token_to_id(EOD)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    entries = []
    for source, group in sorted(texts.items()):
        encoded = encoder.encode(group)
        stream, start = [], 0
        for length in encoded.lengths:
            stream += [*encoded.ids[start : start + length].tolist(), eod]
            start += int(length)
        rows = len(stream) // (SEQ_LEN + 1)
        sequences = (
            np.asarray(stream[: rows * (SEQ_LEN + 1)])
            .reshape(rows, SEQ_LEN + 1)
            .astype(dtype_for_vocab(vocab))
        )
        data = shard_bytes(sequences, eod)
        path = layout.shard_path(source, 0)
        repo.put(branch, path, data)
        entries.append(ShardEntry(name=path, source=source, sha256=hashlib.sha256(data).hexdigest(),
                                  sequences=rows, tokens=sequences.size, bytes=len(data),
                                  documents=int((sequences == eod).sum())))  # fmt: skip
    manifest = Manifest.build(
        entries, seq_len=SEQ_LEN, dtype=dtype_for_vocab(vocab).name, vocab_size=vocab, eod_token=eod,
        tokenizer_sha256=hashlib.sha256(tokenizer_json.encode()).hexdigest(), input_commit=dedup,
    )  # fmt: skip
    repo.put(branch, layout.TOKENIZER, tokenizer_json.encode())
    repo.put(branch, layout.MANIFEST, manifest.to_json().encode())
    shard = repo.commit(branch, "shard", _meta("shard", dedup, flow_run_id)).id
    plan = resolve_mix(
        MixSpec(max_epochs=50.0, seed=seed), manifest.sources, SEQ_LEN, total_tokens=1200 * SEQ_LEN
    )
    repo.put(branch, layout.MIX, plan.to_json().encode())
    mix = repo.commit(branch, "mix", _meta("mix", shard, flow_run_id)).id
    chain = [ChainLink("ingest", f"ingest-{seed}", ingest), ChainLink("dedup", f"dedup-{seed}", dedup),
             ChainLink("shard", f"shard-{seed}", shard), ChainLink("mix", f"mix-{seed}", mix)]  # fmt: skip
    version = publish(repo, mix, chain, flow_run_id, gates_hash="gates")
    repo.delete_branch(branch)
    return version


def _meta(stage: str, input_commit: str, flow_run_id: str) -> dict[str, str]:
    return {"stage": stage, "stage_config_hash": f"{stage}-hash", "input_commit": input_commit,
            "flow_run_id": flow_run_id}  # fmt: skip
