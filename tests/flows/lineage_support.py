"""Shared by the lineage and rollback tests: hand-made dataset versions and tiny training runs.

A version is published the way the curate flow publishes (:func:`flows.wap.publish`: a run
branch with stage commits, merged into main with the stage chain and tagged), holding a
synthetic dataset (shards, manifest, mix) the real trainer can train on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from flows.wap import ChainLink, PublishedVersion, publish, run_branch
from formats.layout import LINEAGE_BRANCH, checkpoint_record_path
from training.config import CheckpointConfig, DataConfig, ModelConfig, StabilityConfig, TrainConfig
from training.synthetic import publish_synthetic_dataset
from training.trainer import TrainResult, train
from versioning import DataRepo
from versioning.local import LocalRepo

GOOD_SOURCES = {"web": 240, "code": 160}
BAD_SOURCES = {"web": 240, "code": 160, "spam": 200}

# the train flow's overrides for a tiny run that checkpoints every 2 steps
TINY_RUN = {
    "global_batch": 8, "micro_batch": 4, "eval_every": 0,
    "data": {"heldout_fraction": 0.05, "eval_sequences": 8, "prefetch_batches": 2},
    "checkpoint": {"every": 2, "keep_last": 10, "async_save": False},
    "stability": {"window": 8, "min_history": 4},
}  # fmt: skip


def publish_version(
    repo: DataRepo, flow_run_id: str, sources: dict[str, int], seed: int, source_configs: bool = False
) -> PublishedVersion:
    """Ingest, shard and mix commits on a run branch, published into main and tagged.

    ``source_configs``: the ingest report also records each source's config section."""
    branch = run_branch(flow_run_id)
    main = repo.create_branch(branch, "main")
    per_source = {
        name: {"kind": "code" if name == "code" else "prose", "format": "files", "reference": False,
               "documents_in": n, "kept": n}
        for name, n in sources.items()
    }  # fmt: skip
    report: dict[str, Any] = {"stage": "ingest", "per_source": per_source}
    if source_configs:
        report["extra"] = {"sources": [
            {"name": name, "kind": stats["kind"], "format": "files", "path": f"/data/{name}", "include": ["*.txt"]}
            for name, stats in per_source.items()
        ]}  # fmt: skip
    repo.put(branch, "reports/ingest.json", json.dumps(report).encode())
    # allow_empty, as every stage commits (tasks/io.py): a run may ingest what main already holds.
    ingest = repo.commit(
        branch, "ingest", _stage_meta("ingest", f"ingest-{seed}", main, flow_run_id), allow_empty=True
    ).id
    shard = publish_synthetic_dataset(repo, branch, sources, total_samples=1200, seed=seed)
    mix = repo.commit(
        branch, "mix", _stage_meta("mix", f"mix-{seed}", shard, flow_run_id), allow_empty=True
    ).id
    chain = [ChainLink("ingest", f"key-ingest-{seed}", ingest), ChainLink("shard", f"key-shard-{seed}", shard),
             ChainLink("mix", f"key-mix-{seed}", mix)]  # fmt: skip
    version = publish(repo, mix, chain, flow_run_id, gates_hash="gates")
    repo.delete_branch(branch)
    return version


def _stage_meta(stage: str, config_hash: str, input_commit: str, flow_run_id: str) -> dict[str, str]:
    return {"stage": stage, "stage_config_hash": config_hash, "input_commit": input_commit,
            "flow_run_id": flow_run_id}  # fmt: skip


def train_config(repo_spec: str, home: Path, run: str, commit: str, steps: int, **fields: Any) -> TrainConfig:
    """A tiny, fast run: 2-layer model, 8 sequences of 32 tokens per step, a checkpoint every 2."""
    defaults: dict[str, Any] = dict(
        run=run, commit=commit, repo=repo_spec, home=str(home), steps=steps, global_batch=8, micro_batch=4,
        model=ModelConfig.preset("tiny"),
        data=DataConfig(heldout_fraction=0.05, eval_sequences=8, prefetch_batches=2),
        checkpoint=CheckpointConfig(every=2, keep_last=10, async_save=False),
        stability=StabilityConfig(window=8, min_history=4), eval_every=0, progress=False,
    )  # fmt: skip
    return TrainConfig(**{**defaults, **fields})


def train_tiny(repo_spec: str, home: Path, run: str, commit: str, steps: int, **fields: Any) -> TrainResult:
    return train(train_config(repo_spec, home, run, commit, steps, **fields))


def write_checkpoint_records(repo: DataRepo, run: str, commit: str, steps: list[int]) -> None:
    """Lineage records in the trainer's format, without training (for queries over many checkpoints)."""
    if LINEAGE_BRANCH not in repo.list_branches():
        repo.create_branch(LINEAGE_BRANCH, "main")
    for step in steps:
        record = {
            "run": run, "step": step, "tokens": step * 256, "world_size": 1,
            "loader": {"cursor": step * 8, "skipped": []}, "rollbacks": [], "data_changes": [],
            "data": {"repository": "test", "commit": commit, "manifest_sha256": "m", "mix_sha256": "x",
                     "tokenizer_sha256": ""},
            "code_version": "test", "flow_run_id": "", "metrics": {"loss": 5.0 - step / 1000, "step": step},
            "saved_at": float(step), "checkpoint": f"/nowhere/runs/{run}/checkpoints/step-{step:07d}",
        }  # fmt: skip
        repo.put(LINEAGE_BRANCH, checkpoint_record_path(run, step), (json.dumps(record) + "\n").encode())
    repo.commit(
        LINEAGE_BRANCH, f"lineage: run {run}, {len(steps)} record(s)", {"kind": "lineage", "run": run}
    )


@contextmanager
def local_backend(workdir: Path) -> Iterator[tuple[DataRepo, str]]:
    repo = LocalRepo(workdir / "repo")
    repo.ensure()
    yield repo, str(workdir / "repo")


@contextmanager
def double_backend(workdir: Path) -> Iterator[tuple[DataRepo, str]]:
    """LakeFSRepo over the API double; the spec string lets the trainer open it the lakectl way."""
    from tests.lakefs_double import LakeFSDouble
    from tests.versioning.lakefs_backends import connect

    with LakeFSDouble(workdir / "lakefs-double") as double:
        repo = connect(double, repository="lineage")
        repo.ensure()
        with lakectl_environment(double):
            yield repo, "lakefs://lineage"
        assert double.violations == [], "\n".join(double.violations)


@contextmanager
def real_lakefs_backend(workdir: Path) -> Iterator[tuple[DataRepo, str]]:
    """A fresh repository on the session's real lakeFS (tests/lakefs_real), opened the lakectl way."""
    import uuid

    from tests.lakefs_real import real_lakefs

    server = real_lakefs()
    name = f"lineage-{uuid.uuid4().hex[:12]}"
    repo = server.connect(name)
    repo.ensure()
    with lakectl_environment(server):
        yield repo, f"lakefs://{name}"
    repo._repo.delete()


@contextmanager
def lakectl_environment(server: Any) -> Iterator[None]:
    import os

    names = {
        "LAKECTL_SERVER_ENDPOINT_URL": server.endpoint,
        "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": server.access_key_id,
        "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": server.secret_access_key,
    }
    if getattr(server, "namespace_prefix", None):  # a real server: where its repositories go
        names["TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"] = server.namespace_prefix
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


BACKENDS: dict[str, Callable[[Path], AbstractContextManager[tuple[DataRepo, str]]]] = {
    "local": local_backend,
    "lakefs-double": double_backend,
    "lakefs-real": real_lakefs_backend,
}
