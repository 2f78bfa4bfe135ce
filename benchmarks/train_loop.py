"""The full training loop against a bare loop on the same model, batch and data, in one run.

* full: ``training.trainer.train`` as a user runs it (one process): the shard loader with
  its prefetch thread reading the cached shards of a synthetic dataset commit, the spike
  detector, JSONL metrics and the progress bar, asynchronous checkpoints every
  ``--ckpt-every`` steps with their lineage records. Evaluation is off (the bare loop
  has nothing like it).
* bare: the same model, initialisation, AdamW groups, micro-batching and clipping over the
  same batches, already in memory as tensors: forward, backward, clip, step, nothing else.

Both time steps ``--warmup``..``--steps``. The headline ratio is tokens per CPU-second of
the whole process (every thread: the loader's prefetch and the checkpoint writer count
against the full loop), summed over the interleaved rounds: on this shared 2-core machine
wall time swings by tens of percent between rounds while CPU time does not. The wall-clock
tokens/s of every round (and the ratio of the best rounds) are reported beside it; on a GPU
machine ``benchmarks/gpu_train.py`` reports the wall-clock ratio. Also reported: the share
of step time the full loop waited for data, and the checkpoint stall (the time a save
blocked the training thread) with the same save done synchronously for comparison.

    .venv/bin/python benchmarks/train_loop.py [--steps 60] [--rounds 3] [--threads 1]

Results go to benchmarks/results/train_loop.json. Last line:
``train_loop: full/bare=<x> data_wait=<y>% ckpt_stall_ms=<z>``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from training.checkpoint import CheckpointManager, load_payload, newest_valid  # noqa: E402
from training.config import CheckpointConfig, DataConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from training.data import ShardCache, batch_positions, open_dataset  # noqa: E402
from training.metrics import read_metrics  # noqa: E402
from training.model import GPT  # noqa: E402
from training.runstate import WarmupCosine, autocast_dtype, seed_everything  # noqa: E402
from training.synthetic import publish_synthetic_dataset  # noqa: E402
from training.trainer import train  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train_loop.json"


def make_config(args: argparse.Namespace, home: Path, commit: str, run: str) -> TrainConfig:
    return TrainConfig(
        run=run,
        commit=commit,
        repo=str(home / "repo"),
        home=str(home),
        steps=args.steps,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        model=ModelConfig(n_layer=args.layers, n_head=args.heads, n_embd=args.width),
        optim=OptimConfig(warmup_steps=10),
        data=DataConfig(heldout_fraction=0.01),
        checkpoint=CheckpointConfig(every=args.ckpt_every, keep_last=2, async_save=True),
        eval_every=0,
        report=False,
    )


def bare_loop(
    config: TrainConfig, home: Path, commit: str, desc: str, device: torch.device
) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each step of the bare loop over the batches the full loop trains on."""
    repo = LocalRepo(home / "repo")
    _, data = open_dataset(
        repo, str(home / "repo"), commit, ShardCache(config.cache_dir()), config.data.heldout_fraction,
        fetch=True, barrier=lambda: None,
    )  # fmt: skip
    batches, cursor = [], 0
    accumulation = config.accumulation_steps(1)
    for _ in range(config.steps):
        positions, cursor = batch_positions(data, cursor, config.global_batch, [])
        source, _, index = data.plan.locate(positions)
        rows = torch.from_numpy(data.rows(source, index)).to(device)
        batches.append(rows.view(accumulation, config.micro_batch, -1))
    seed_everything(config.seed)
    raw = GPT(config.model.gpt_config(data.manifest.vocab_size, data.seq_len)).to(device)
    model = torch.compile(raw) if config.compile else raw
    o = config.optim
    optimizer = torch.optim.AdamW(
        raw.optimizer_groups(o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
        fused=device.type == "cuda",
    )  # fmt: skip
    dtype = autocast_dtype(config.dtype, device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    schedule = WarmupCosine(o, config.steps)
    times = []
    for step, tokens in enumerate(tqdm(batches, desc=desc, unit="step")):
        started, started_cpu = time.perf_counter(), time.process_time()
        for micro in tokens:
            with autocast:
                _, loss = model(micro[:, :-1], micro[:, 1:])
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), o.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started, time.process_time() - started_cpu))
    return times


def full_loop(config: TrainConfig) -> list[dict]:
    train(config)
    return [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "train"]


def sync_save_ms(run_dir: Path, scratch: Path) -> float:
    """The same checkpoint saved synchronously: the stall an asynchronous save hides."""
    info = newest_valid(run_dir / "checkpoints")
    payload = load_payload(info, ("model.pt", "optim.pt", "state.pt"))
    return (
        1000
        * CheckpointManager(scratch, keep_last=1, async_save=False)
        .save(info.step, payload, info.meta)
        .stall_s
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--ckpt-every", type=int, default=50, help="the trainer's default schedule")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="train-loop-") as tmp:
        home = Path(tmp)
        repo = LocalRepo(home / "repo")
        repo.ensure()
        sequences = args.steps * args.global_batch
        commit = publish_synthetic_dataset(
            repo, "main", {"web": sequences, "code": sequences}, seq_len=args.seq_len, vocab_size=4096,
            shards_per_source=4, total_samples=4 * sequences,
        )  # fmt: skip
        tokens = args.global_batch * args.seq_len  # per step
        wall = {"bare": [], "full": []}  # tokens/s of each round
        cpu = {"bare": [0.0, 0], "full": [0.0, 0]}  # CPU seconds and steps, all rounds together
        waits, stalls = [], []
        for round_ in range(1, args.rounds + 1):
            config = make_config(args, home, commit, f"full-{round_}")
            bare = bare_loop(config, home, commit, f"bare {round_}/{args.rounds}", torch.device("cpu"))
            bare = bare[args.warmup :]
            records = full_loop(config)[args.warmup :]
            seconds = sum(r["step_ms"] for r in records) / 1000
            wall["bare"].append(tokens * len(bare) / sum(w for w, _ in bare))
            wall["full"].append(tokens * len(records) / seconds)
            cpu["bare"] = [cpu["bare"][0] + sum(c for _, c in bare), cpu["bare"][1] + len(bare)]
            cpu["full"] = [
                cpu["full"][0] + sum(r["cpu_ms"] for r in records) / 1000,
                cpu["full"][1] + len(records),
            ]
            waits.append(sum(r["data_wait_ms"] for r in records) / 1000 / seconds)
            stalls += [r["ckpt_stall_ms"] for r in records if "ckpt_stall_ms" in r]
            print(f"round {round_}: bare {wall['bare'][-1]:.0f}, full {wall['full'][-1]:.0f} tokens/s (wall)")
        sync_ms = sync_save_ms(config.run_dir(), home / "sync-save")

    per_cpu_second = {side: tokens * steps / seconds for side, (seconds, steps) in cpu.items()}
    ratio = per_cpu_second["full"] / per_cpu_second["bare"]
    wall_ratio = max(wall["full"]) / max(wall["bare"])
    result = {
        "config": dict(vars(args)),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "cpu_threads": args.threads},
        "tokens_per_cpu_second": {side: round(v, 1) for side, v in per_cpu_second.items()},
        "tokens_per_s_wall": {side: [round(x, 1) for x in v] for side, v in wall.items()},
        "full_over_bare": round(ratio, 4),
        "full_over_bare_wall_best_rounds": round(wall_ratio, 4),
        "data_wait_share": round(statistics.median(waits), 5),
        "ckpt_stall_ms": round(statistics.median(stalls), 2) if stalls else None,
        "ckpt_sync_save_ms": round(sync_ms, 2),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("| | bare | full | full/bare |\n|---|---|---|---|")
    print(
        f"| tokens per CPU-second (all rounds) | {per_cpu_second['bare']:.0f} | "
        f"{per_cpu_second['full']:.0f} | {ratio:.3f} |"
    )
    print(
        f"| tokens/s, wall (best round) | {max(wall['bare']):.0f} | {max(wall['full']):.0f} | {wall_ratio:.3f} |"
    )
    print(
        f"checkpoint: synchronous save {sync_ms:.1f} ms; asynchronous stall {result['ckpt_stall_ms']} ms (median)"
    )
    print(
        f"train_loop: full/bare={ratio:.3f} data_wait={100 * result['data_wait_share']:.2f}% "
        f"ckpt_stall_ms={result['ckpt_stall_ms']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
