"""Shared pieces of the training tests: a small dataset commit, configs, torchrun launches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from training.checkpoint import COMPLETE, newest_valid, step_dir_name
from training.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    StabilityConfig,
    TrainConfig,
)
from training.data import ShardCache, batch_positions, open_dataset
from training.metrics import read_metrics
from training.synthetic import publish_synthetic_dataset
from versioning.local import LocalRepo

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"web": 240, "code": 160}


@dataclass(frozen=True)
class Dataset:
    home: Path
    repo: Path
    commit: str


def make_dataset(
    home: Path,
    branch: str = "main",
    seed: int = 0,
    sources: dict[str, int] = SOURCES,
    shards_per_source: int = 2,
) -> Dataset:
    repo_path = home / "repo"
    repo = LocalRepo(repo_path)
    repo.ensure()
    commit = publish_synthetic_dataset(
        repo, branch, sources, seq_len=32, vocab_size=256, total_samples=1200, seed=seed,
        shards_per_source=shards_per_source,
    )  # fmt: skip
    return Dataset(home, repo_path, commit)


def make_config(ds: Dataset, run: str, **fields) -> TrainConfig:
    """A tiny, fast run: 2-layer model, 8 sequences of 32 tokens per step."""
    defaults = dict(
        run=run,
        commit=ds.commit,
        repo=str(ds.repo),
        home=str(ds.home),
        steps=16,
        global_batch=8,
        micro_batch=2,
        model=ModelConfig.preset("tiny"),
        optim=OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=2),
        data=DataConfig(heldout_fraction=0.05, eval_sequences=16, prefetch_batches=2),
        checkpoint=CheckpointConfig(every=4, keep_last=3),
        stability=StabilityConfig(window=8, min_history=4),
        eval_every=8,
        progress=False,
        report=False,
    )
    return TrainConfig(**{**defaults, **fields})


def windows(ds: Dataset, tmp_path: Path, steps: int, skipped: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) of the sample window of each step (global batch 8), as the loader computes it."""
    repo = LocalRepo(ds.repo)
    _, data = open_dataset(
        repo, str(ds.repo), ds.commit, ShardCache(tmp_path / "cache"), 0.05, True, lambda: None
    )
    found, cursor = [], 0
    for _ in range(steps):
        _, end = batch_positions(data, cursor, 8, skipped)
        found.append((cursor, end))
        cursor = end
    return found


def device_for_ranks(nproc: int) -> tuple[str, str | None]:
    """The ``TrainConfig.device`` for a job of ``nproc`` ranks on this machine, and why, when it
    falls back: each rank needs its own CUDA device; with fewer, the job runs on the CPU with gloo."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available >= nproc:
        return "auto", None
    if available == 0:
        return "cpu", None  # no CUDA at all: gloo on the CPU is the plain setup, nothing to report
    return "cpu", f"{available} CUDA device(s) for {nproc} ranks: these jobs run on the CPU with gloo"


def train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"step-{step:07d}" / "model.pt", weights_only=True)


def torchrun_command(config: TrainConfig, nproc: int) -> list[str]:
    path = config.run_dir().parent / f"{config.run}.config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.model_dump_json())
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "training", "--config", str(path),
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(config: TrainConfig, nproc: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        torchrun_command(config, nproc), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def newest_durable_step(config: TrainConfig) -> int | None:
    """The step of the newest checkpoint that verifies: where a resume must start."""
    found = newest_valid(config.run_dir() / "checkpoints", warn=lambda _: None)
    return None if found is None else found.step


def torchrun_killed_after(config: TrainConfig, nproc: int, step: int, durable: int | None = None) -> int:
    """Launch, and SIGKILL the workers and torchrun from outside once ``step`` is logged (at
    whatever point of the next step or save they are) and, if ``durable`` is given, once the
    checkpoint of that step is complete on disk. Returns torchrun's exit status."""
    metrics = config.run_dir() / "metrics.jsonl"
    marker = config.run_dir() / "checkpoints" / step_dir_name(durable or 0) / COMPLETE
    seen = len(train_records(config.run_dir())) if metrics.exists() else 0
    proc = subprocess.Popen(
        torchrun_command(config, nproc), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        records = train_records(config.run_dir()) if metrics.exists() else []
        if any(r["step"] >= step for r in records[seen:]) and (durable is None or marker.exists()):
            for pid in [*children(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.05)
    return proc.wait(timeout=60)
