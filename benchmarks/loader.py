"""Data wait of the streaming loader, against the trainer's own consumption, in one run.

Every scenario trains the same model on the same synthetic commit (many small shards) with
the default loader (a loader process per node with a warm shadow, ``data.loader =
"process"``), each as its own ``python -m training`` process with a fresh run directory:

* ``warm``: every shard already in the cache (the fully downloaded dataset), and
  ``warm-thread`` the same with the in-process thread loader;
* ``cold-local``: an empty cache, shards streamed from the local repository;
* ``cold-local-cap``: the same with the cache capped at a tenth of the commit's shards;
* ``cold-lakefs``: an empty cache, shards streamed over the lakeFS API double (real HTTP,
  the official SDK) with ``--latency-ms`` added to every request;
* ``takeover``: warm cache, the active loader SIGKILLed every ``--kill-every`` batches
  (each time once the shadow is warm), and ``takeover-prefetch-1`` the same with one
  batch of prefetch, so the ring hides as little of a takeover as it can.

The baseline is the trainer's consumption in the same scenario: the data wait share is
the time steps waited for a batch over their wall time (steps 2..N; step 1 also waits for
the loader processes to start and is reported apart, as the time to the first batch). The
ratio column divides each scenario's share by the warm cache's. For the takeovers, the
longest data wait of any step after a kill is the stall a loader failure cost training.

    .venv/bin/python benchmarks/loader.py [--steps 60] [--latency-ms 20] [--kill-every 10]

Results go to benchmarks/results/loader.json. Last line: ``loader: warm=<x>% cold-local=<y>%
cold-lakefs=<z>% takeover_stall_ms=<s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.shards import Manifest  # noqa: E402
from tests.flows.lineage_support import lakectl_environment  # noqa: E402
from tests.lakefs_double import FaultConfig, LakeFSDouble  # noqa: E402
from tests.versioning.lakefs_backends import connect  # noqa: E402
from training.config import CheckpointConfig, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from training.config import FaultConfig as TrainFaults  # noqa: E402
from training.data import ShardCache, open_dataset  # noqa: E402
from training.metrics import read_metrics  # noqa: E402
from training.synthetic import publish_synthetic_dataset  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "loader.json"


def publish(repo, args) -> str:
    per_source = args.steps * args.global_batch
    return publish_synthetic_dataset(
        repo, "main", {"web": per_source, "code": per_source}, seq_len=args.seq_len, vocab_size=4096,
        shards_per_source=args.shards_per_source, total_samples=2 * per_source,
    )  # fmt: skip


def run(args, home: Path, name: str, repo: str, commit: str, **changes) -> dict:
    """Train one scenario in its own process; its train records and loader summary."""
    faults = changes.pop("faults", TrainFaults())
    config = TrainConfig(
        run=name, commit=commit, repo=repo, home=str(home / name), steps=args.steps,
        global_batch=args.global_batch, micro_batch=args.micro_batch,
        model=ModelConfig(n_layer=args.layers, n_head=args.heads, n_embd=args.width),
        data=DataConfig(heldout_fraction=0.01, **changes), checkpoint=CheckpointConfig(every=args.steps),
        faults=faults, eval_every=0, report=False, progress=False,
    )  # fmt: skip
    path = home / f"{name}.json"
    path.write_text(config.model_dump_json())
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "training", "--config", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"scenario {name} failed:\n{done.stderr[-3000:]}")
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    return {"train": [r for r in records if r["kind"] == "train"],
            "data": [r for r in records if r["kind"] == "data"][-1],
            "takeovers": [r for r in records if r["kind"] == "loader_takeover"]}  # fmt: skip


def figures(outcome: dict, kills: tuple[int, ...] = ()) -> dict:
    train = outcome["train"]
    steady = train[1:]
    wall = sum(r["step_ms"] for r in steady)
    figure = {
        "first_batch_wait_s": round(train[0]["data_wait_ms"] / 1000, 3),
        "data_wait_share": round(sum(r["data_wait_ms"] for r in steady) / wall, 5),
        "data_wait_ms_total": round(sum(r["data_wait_ms"] for r in steady), 1),
        "step_ms_median": round(statistics.median(r["step_ms"] for r in steady), 1),
        "cache": outcome["data"]["cache"],
    }
    if kills:
        after = [r["data_wait_ms"] for r in train if any(k < r["step"] <= k + 3 for k in kills)]
        figure["kills"] = len(outcome["takeovers"])
        figure["takeover_stall_ms_max"] = round(max(after), 2)
        figure["takeover_stall_ms_median"] = round(statistics.median(after), 2)
        figure["supervisor_takeover_ms_median"] = round(
            statistics.median(t["takeover_ms"] for t in outcome["takeovers"]), 2
        )
        figure["warm_shadow_takeovers"] = sum(t["warm_shadow"] for t in outcome["takeovers"])
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the trainer")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--shards-per-source", type=int, default=120)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every lakeFS double request")
    parser.add_argument("--kill-every", type=int, default=10, help="batches between loader kills")
    args = parser.parse_args()

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        home = Path(tmp)
        local = LocalRepo(home / "repo")
        local.ensure()
        commit = publish(local, args)
        manifest = Manifest.from_json(local.get(commit, "shards/manifest.json"))
        total_bytes = sum(e.bytes for e in manifest.shards)
        kills = tuple(range(args.kill_every, args.steps - 2, args.kill_every))

        warm_cache = home / "warm-cache"
        open_dataset(local, str(local.root), commit, ShardCache(warm_cache), 0.01, True, lambda: None)
        spec = str(local.root)
        results["warm"] = figures(run(args, home, "warm", spec, commit, cache_dir=str(warm_cache)))
        results["warm-thread"] = figures(
            run(args, home, "warm-thread", spec, commit, cache_dir=str(warm_cache), loader="thread")
        )
        results["cold-local"] = figures(run(args, home, "cold-local", spec, commit))
        results["cold-local-cap"] = figures(
            run(
                args,
                home,
                "cold-local-cap",
                spec,
                commit,
                cache_max_bytes=total_bytes // 10,
                cache_protect_steps=1,
            )
        )
        with LakeFSDouble(home / "double") as double, lakectl_environment(double):
            remote = connect(double, repository="bench")
            remote.ensure()
            remote_commit = publish(remote, args)
            double.faults = FaultConfig(latency_s=args.latency_ms / 1000)
            results["cold-lakefs"] = figures(run(args, home, "cold-lakefs", "lakefs://bench", remote_commit))
            requests = dict(double.requests)
        results["cold-lakefs"]["requests"] = requests
        for name, prefetch in (("takeover", 4), ("takeover-prefetch-1", 1)):
            outcome = run(
                args, home, name, spec, commit, cache_dir=str(warm_cache), prefetch_batches=prefetch,
                faults=TrainFaults(kill_loader_at_batches=kills),
            )  # fmt: skip
            results[name] = figures(outcome, kills)

    warm_share = results["warm"]["data_wait_share"]
    result = {
        "config": dict(vars(args)),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "commit": {"shards": len(manifest.shards), "bytes": total_bytes},
        "scenarios": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(manifest.shards)} shards, {total_bytes / 2**20:.1f} MiB; {args.steps} steps of {args.global_batch} x "
          f"{args.seq_len} tokens")  # fmt: skip
    print(
        "| scenario | first batch (s) | data wait / step time | vs warm | step ms (median) | fetched | evicted |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, f in results.items():
        ratio = f["data_wait_share"] / warm_share if warm_share else float("nan")
        print(
            f"| {name} | {f['first_batch_wait_s']:.2f} | {100 * f['data_wait_share']:.2f}% | {ratio:.1f}x | "
            f"{f['step_ms_median']:.0f} | {f['cache']['fetched']} | {f['cache']['evicted']} |"
        )
    for name in ("takeover", "takeover-prefetch-1"):
        f = results[name]
        print(
            f"{name}: {f['kills']} kills ({f['warm_shadow_takeovers']} with a warm shadow); longest data wait in "
            f"the 3 steps after a kill {f['takeover_stall_ms_max']:.1f} ms (median {f['takeover_stall_ms_median']:.2f}"
            f" ms); supervisor takeover {f['supervisor_takeover_ms_median']:.1f} ms (median)"
        )
    print(
        f"loader: warm={100 * warm_share:.2f}% cold-local={100 * results['cold-local']['data_wait_share']:.2f}% "
        f"cold-lakefs={100 * results['cold-lakefs']['data_wait_share']:.2f}% "
        f"takeover_stall_ms={results['takeover-prefetch-1']['takeover_stall_ms_max']:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
