"""Shared by the curate tests: a small generated corpus, parameters that run fast, and probes."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from flows.artifacts import StageEvent, listening
from flows.params import CurateParams
from formats.layout import STAGES
from versioning import DataRepo

_NOUNS = [
    "river",
    "mountain",
    "engineer",
    "library",
    "window",
    "garden",
    "signal",
    "teacher",
    "market",
    "harbor",
    "forest",
    "planet",
    "letter",
    "village",
    "museum",
    "kitchen",
    "bridge",
    "doctor",
    "station",
    "island",
    "journey",
    "machine",
    "painter",
    "orchard",
    "valley",
    "pattern",
    "lantern",
    "meadow",
    "captain",
    "student",
    "archive",
    "theory",
    "harvest",
    "chapter",
    "season",
    "factory",
    "mirror",
    "compass",
    "council",
    "desert",
    "ocean",
]
_VERBS = [
    "describes",
    "follows",
    "carries",
    "protects",
    "measures",
    "builds",
    "studies",
    "finds",
    "reaches",
    "changes",
    "explains",
    "records",
    "improves",
    "collects",
    "shapes",
    "remembers",
    "visits",
    "opens",
    "repairs",
]
_ADJECTIVES = [
    "quiet",
    "ancient",
    "careful",
    "bright",
    "narrow",
    "patient",
    "distant",
    "gentle",
    "rapid",
    "simple",
    "crowded",
    "hidden",
    "golden",
    "modern",
    "honest",
    "sudden",
    "famous",
    "humble",
    "clever",
    "silent",
]
_LINKS = ["and", "but", "while", "because", "although", "so", "when", "after"]


FILES_SOURCES_TOML = """
[[ingest.sources]]
name = "prose"
kind = "prose"
format = "files"
path = "sources/prose"

[[ingest.sources]]
name = "code"
kind = "code"
format = "files"
path = "sources/code"
"""
"""The two sources write_corpus writes, as a curate TOML's [[ingest.sources]] (paths relative to tmp_path)."""


def ran_from(stage: str) -> dict[str, str]:
    """The stage outcomes of a run that reuses every stage before ``stage`` and runs the rest."""
    return {s: "reused" if i < STAGES.index(stage) else "ran" for i, s in enumerate(STAGES)}


def sentence(rng: random.Random) -> str:
    def phrase() -> str:
        return f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"

    clause = f"{phrase()} {rng.choice(_VERBS)} {phrase()} of {rng.choice(_NOUNS)}"
    if rng.random() < 0.5:
        clause += f" {rng.choice(_LINKS)} {phrase()} {rng.choice(_VERBS)} it with {rng.choice(_NOUNS)}"
    return clause[0].upper() + clause[1:] + "."


def prose_document(rng: random.Random, words: int = 160) -> str:
    paragraphs, count = [], 0
    while count < words:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 5)))
        paragraphs.append(paragraph)
        count += len(paragraph.split())
    return "\n\n".join(paragraphs) + "\n"


def code_document(rng: random.Random, index: int) -> str:
    lines = [f'"""Helpers for the {rng.choice(_NOUNS)} {rng.choice(_NOUNS)} module {index}."""', ""]
    for f in range(rng.randint(3, 6)):
        name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{index}_{f}"
        arg = rng.choice(_NOUNS)
        lines += [
            f"def {name}({arg}, limit={rng.randint(2, 99)}):",
            f'    """Return how the {rng.choice(_ADJECTIVES)} {arg} changes."""',
            f"    total = {rng.randint(0, 9)}",
            f"    for step in range({arg}):",
            f"        if step % {rng.randint(2, 7)} == 0:",
            f"            total += step * {rng.randint(1, 9)}",
            "        if total > limit:",
            "            break",
            "    return total",
            "",
        ]
    return "\n".join(lines)


def write_corpus(root: Path, documents: int = 30, seed: int = 0) -> dict[str, Path]:
    """Two sources with planted bad input: an exact and a near duplicate, an empty and a binary file."""
    rng = random.Random(seed)
    prose, code = root / "prose", root / "code"
    prose.mkdir(parents=True)
    code.mkdir(parents=True)
    for i in range(documents):
        (prose / f"essay-{i:03d}.txt").write_text(prose_document(rng))
        (code / f"module_{i:03d}.py").write_text(code_document(rng, i))
    (prose / "essay-copy.txt").write_text((prose / "essay-000.txt").read_text())
    near = (prose / "essay-001.txt").read_text().split(" ")
    near[5] = "lighthouse"
    (prose / "essay-near.txt").write_text(" ".join(near))
    (prose / "empty.txt").write_text("")
    (code / "blob.bin").write_bytes(bytes(range(256)) * 8)
    return {"prose": prose, "code": code}


def params_for(corpus: dict[str, Path], repo_spec: str, results: Path, **sections: Any) -> CurateParams:
    """Fast parameters: a tiny vocabulary, short sequences, quick retries."""
    data: dict[str, Any] = {
        "ingest": {
            "sources": [
                {"name": "prose", "kind": "prose", "format": "files", "path": str(corpus["prose"])},
                {"name": "code", "kind": "code", "format": "files", "path": str(corpus["code"])},
            ]
        },
        "shards": {"vocab_size": 300, "seq_len": 64, "tokenizer_sample_mb": 1.0},
        "gates": {"min_documents": 10, "min_tokens": 1000},
        "repository": {"spec": repo_spec, "results": str(results)},
        "retry": {"retries": 3, "backoff_seconds": 0.05, "jitter_factor": 0.5},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return CurateParams.from_dict(data)


@contextmanager
def stage_outcomes() -> Iterator[dict[str, str]]:
    """{stage: 'ran' | 'reused'} of the flows run while the block runs."""
    outcomes: dict[str, str] = {}

    def record(event: StageEvent) -> None:
        if event.result is not None:
            outcomes[event.stage] = "reused" if event.reused else "ran"

    with listening(record):
        yield outcomes


def column(repo: DataRepo, ref: str, prefix: str, name: str) -> list[Any]:
    values: list[Any] = []
    for stat in repo.list(ref, prefix):
        if stat.path.endswith(".parquet"):
            values += (
                pq.read_table(pa.BufferReader(repo.get(ref, stat.path)), columns=[name])
                .column(name)
                .to_pylist()
            )
    return values


def stage_commits(repo: DataRepo, ref: str) -> dict[str, dict[str, str]]:
    """Metadata of the newest commit of each stage reachable from ``ref``."""
    found: dict[str, dict[str, str]] = {}
    for commit in repo.log(ref):
        stage = commit.metadata.get("stage")
        if stage and stage not in found:
            found[stage] = commit.metadata | {"id": commit.id}
    return found


def manifest_tokens(repo: DataRepo, ref: str) -> int:
    return int(json.loads(repo.get(ref, "shards/manifest.json"))["totals"]["tokens"])
