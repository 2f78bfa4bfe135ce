"""GPT-2 presets on one CUDA device: the full trainer against a bare loop, with and without checkpoints.

For each preset (default ``gpt2-124m``; ``--presets gpt2-124m,gpt2-350m,gpt2-774m`` for all)
it writes synthetic shards (vocabulary 50257, ``--seq-len`` tokens) into a temporary local
repository and measures, in this process, one after another:

* bare: the same model, levers and micro-batch, batches already on the GPU; forward,
  backward, clip, fused AdamW, nothing else, and one device sync at each end of the window;
* steady: ``training.trainer.train`` as a user runs it (shard loader with pinned-memory
  prefetch, spike checks, metrics, lineage), checkpointing only at the start and the end;
* with checkpoints: the same with a checkpoint every ``--ckpt-every`` steps inside the window.

Reported separately for each: tokens/s and MFU over the timed window (steps after
``--warmup``, which holds compilation, up to the last judgement window, which holds the
final save); the stall of each save inside the window (the time ``save()`` blocked the
training thread, including any wait for the previous save's write); the final save (its
stall plus the wait for its write at the end of the run, neither counted as step time);
peak device memory; the share of step time spent waiting for data.

MFU = flops_per_token x tokens/s / peak, with ``flops_per_token = 6 N + 12 L H Q T``
(``GPT.flops_per_token``) and the dense bf16 peak of the device from
``training.metrics.PEAK_BF16_FLOPS`` (H100/H200 SXM: 989 TFLOP/s) or ``--peak-flops``.
``full/bare`` is the with-checkpoints run's tokens/s over the bare loop's.

    .venv/bin/python benchmarks/gpu_train.py --presets gpt2-124m --micro-batch auto --loss-chunk-tokens 8192 \\
        --compile-scope blocks --sync-every 10
    .venv/bin/python benchmarks/gpu_train.py --smoke --out /tmp/gpu_train_smoke.json   # CPU, seconds

Results go to ``--out`` (default benchmarks/results/gpu_train.json): device, torch version, the
levers, and one entry per preset (an existing file from the same device and torch keeps the
entries of presets not run this time). Last line, for the first preset:
``gpu_train: tokens/s=<steady> mfu=<x>% mfu_with_ckpt=<y>% stall_ms=<max> full/bare=<z>``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from training.config import (  # noqa: E402
    MODEL_PRESETS,
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PerfConfig,
    TrainConfig,
)
from training.data import ShardCache, batch_positions, open_dataset  # noqa: E402
from training.membudget import choose_micro_batch  # noqa: E402
from training.metrics import peak_flops, read_metrics  # noqa: E402
from training.model import GPT  # noqa: E402
from training.runstate import WarmupCosine, autocast_dtype, seed_everything  # noqa: E402
from training.synthetic import publish_synthetic_dataset  # noqa: E402
from training.trainer import train  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_train.json"
GPT2_VOCAB = 50257


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", default="gpt2-124m", help="comma-separated model presets")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timed window (compilation)")
    parser.add_argument("--window", type=int, default=30, help="timed steps")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=64, help="sequences per optimizer step")
    parser.add_argument(
        "--micro-batch", default="16", help="sequences per forward/backward, or 'auto' (CUDA)"
    )
    parser.add_argument("--memory-headroom", type=float, default=0.1, help="what 'auto' leaves free")
    parser.add_argument(
        "--ckpt-every", type=int, default=10, help="checkpoint interval of the checkpointed run"
    )
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=PerfConfig.model_fields["compile_mode"].annotation.__args__,
    )
    parser.add_argument("--compile-scope", default="model", choices=["model", "blocks"])
    parser.add_argument("--loss-chunk-tokens", type=int, default=0, help="0: the plain loss over full logits")
    parser.add_argument("--sync-every", type=int, default=1, help="judge (host sync) every N steps")
    parser.add_argument("--no-fused-adamw", action="store_true")
    parser.add_argument("--peak-flops", type=float, default=None, help="per-device peak, FLOP/s")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where shards and checkpoints go (a temp dir)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a seconds-long CPU run of the tiny preset (checks the script, no figures)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.presets, args.seq_len, args.global_batch, args.micro_batch = "tiny", 64, 8, "4"
        args.warmup, args.window, args.ckpt_every, args.no_compile = 2, 4, 2, True
    args.vocab = 512 if args.smoke else GPT2_VOCAB
    # windows of judged steps line up with the timed window, so none straddles its ends
    for name in ("warmup", "window"):
        if getattr(args, name) % args.sync_every:
            parser.error(f"--{name} must be a multiple of --sync-every")
    return args


def levers(args: argparse.Namespace) -> PerfConfig:
    return PerfConfig(
        compile_mode=args.compile_mode,
        compile_scope=args.compile_scope,
        loss_chunk_tokens=args.loss_chunk_tokens,
        fused_optimizer=not args.no_fused_adamw,
        sync_every=args.sync_every,
    )


def pick_micro_batch(args, config: TrainConfig, device: torch.device) -> tuple[int, dict | None]:
    if args.micro_batch != "auto":
        return int(args.micro_batch), None
    seed_everything(config.seed)
    model = GPT(config.model.gpt_config(args.vocab, args.seq_len, args.loss_chunk_tokens)).to(device)
    dtype = autocast_dtype(config.dtype, device)
    choice = choose_micro_batch(
        model, args.global_batch, args.seq_len, args.vocab, device,
        lambda: torch.autocast(device.type, dtype=dtype), args.memory_headroom,
    )  # fmt: skip
    del model
    return choice.micro_batch, choice.to_dict()


def bare_loop(config: TrainConfig, device: torch.device, warmup: int) -> float:
    """Tokens/s of the bare loop over the steps after ``warmup``: one device sync at each end."""
    repo = LocalRepo(Path(config.repo))
    _, data = open_dataset(
        repo, config.repo, config.commit, ShardCache(config.cache_dir()), config.data.heldout_fraction,
        fetch=True, barrier=lambda: None,
    )  # fmt: skip
    accumulation = config.accumulation_steps(1)
    batches, cursor = [], 0
    for _ in range(config.steps):
        positions, cursor = batch_positions(data, cursor, config.global_batch, [])
        source, _, index = data.plan.locate(positions)
        rows = torch.from_numpy(data.rows(source, index)).to(device)
        batches.append(rows.view(accumulation, config.micro_batch, -1))
    seed_everything(config.seed)
    gpt_config = config.model.gpt_config(
        data.manifest.vocab_size, data.seq_len, config.perf.loss_chunk_tokens
    )
    raw = GPT(gpt_config).to(device)
    if not config.compile:
        model = raw
    elif config.perf.compile_scope == "blocks":
        for block in raw.blocks:
            block.compile(mode=config.perf.compile_mode)
        model = raw
    else:
        model = torch.compile(raw, mode=config.perf.compile_mode)
    o = config.optim
    optimizer = torch.optim.AdamW(
        raw.optimizer_groups(o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
        fused=device.type == "cuda" and config.perf.fused_optimizer,
    )  # fmt: skip
    dtype = autocast_dtype(config.dtype, device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    schedule = WarmupCosine(o, config.steps)
    started = 0.0
    for step, tokens in enumerate(batches):
        if step == warmup:
            synchronize(device)
            started = time.perf_counter()
        for micro in tokens:
            with autocast:
                _, loss = model(micro[:, :-1], micro[:, 1:])
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), o.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    seconds = time.perf_counter() - started
    return (config.steps - warmup) * config.global_batch * data.seq_len / seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Free what the previous run left (a trainer holds reference cycles), so each run starts
    with the device memory the micro-batch was chosen for, and its peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def full_run(config: TrainConfig, device: torch.device, warmup: int, window: int) -> dict:
    """The trainer's own records, reduced to the timed window and the final save."""
    release_memory(device)
    started = time.perf_counter()
    train(config)
    wall = time.perf_counter() - started
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "train"]
    timed = [r for r in steps if warmup < r["step"] <= warmup + window]
    seconds = sum(r["step_ms"] for r in timed) / 1000
    saves = [r for r in timed if "ckpt_stall_ms" in r]
    last = steps[-1]
    drain = next((r["ms"] for r in records if r["kind"] == "checkpoint_drain"), 0.0)
    tokens_per_step = last["tokens"] // last["step"]
    return {
        "tokens_per_s": round(tokens_per_step * len(timed) / seconds, 1),
        "window_steps": [timed[0]["step"], timed[-1]["step"]],
        "saves_in_window": [r["step"] for r in saves],
        "stall_ms": [round(r["ckpt_stall_ms"], 2) for r in saves],
        "wait_for_previous_save_ms": [round(r["ckpt_wait_ms"], 2) for r in saves],
        "staged_mb": round(max((r["ckpt_staged_mb"] for r in saves), default=0.0), 1),
        "final_save_ms": {
            "stall": round(last.get("ckpt_stall_ms", 0.0), 2),
            "write_after_last_step": round(drain, 2),
        },
        "data_wait_share": round(sum(r["data_wait_ms"] for r in timed) / (1000 * seconds), 5),
        "peak_memory_mb": round(max(r["peak_memory_mb"] for r in steps), 1),
        "wall_s": round(wall, 1),
    }


def measure_preset(args, preset: str, device: torch.device, home: Path) -> dict:
    repo = LocalRepo(home / "repo")
    repo.ensure()
    steps = args.warmup + args.window + args.sync_every  # the last judgement window holds the final save
    sequences = steps * args.global_batch
    commit = publish_synthetic_dataset(
        repo, "main", {"web": sequences, "code": sequences}, seq_len=args.seq_len, vocab_size=args.vocab,
        shards_per_source=4, total_samples=2 * sequences,
    )  # fmt: skip
    base = TrainConfig(
        run=f"{preset}-steady", commit=commit, repo=str(home / "repo"), home=str(home), steps=steps,
        global_batch=args.global_batch, micro_batch=1, model=ModelConfig.preset(preset),
        optim=OptimConfig(warmup_steps=args.warmup), data=DataConfig(heldout_fraction=0.01),
        compile=not args.no_compile, perf=levers(args), eval_every=0, report=False, progress=False,
        checkpoint=CheckpointConfig(every=steps + 1, keep_last=1), peak_flops=args.peak_flops,
    )  # fmt: skip
    micro_batch, probe = pick_micro_batch(args, base, device)
    base = base.model_copy(update={"micro_batch": micro_batch})
    print(f"[{preset}] micro-batch {micro_batch}; bare loop ...", flush=True)
    release_memory(device)
    bare = bare_loop(base, device, args.warmup)
    print(f"[{preset}] steady trainer ...", flush=True)
    steady = full_run(base, device, args.warmup, args.window)
    print(f"[{preset}] trainer with a checkpoint every {args.ckpt_every} steps ...", flush=True)
    with_ckpt = full_run(
        base.model_copy(update={"run": f"{preset}-ckpt", "checkpoint": CheckpointConfig(every=args.ckpt_every, keep_last=1)}),
        device, args.warmup, args.window,
    )  # fmt: skip

    with torch.device("meta"):  # the FLOP count needs the shapes, not the weights
        flops_per_token = GPT(base.model.gpt_config(args.vocab, args.seq_len)).flops_per_token(args.seq_len)
    peak = peak_flops(device, args.peak_flops)

    def mfu(rate: float) -> float | None:
        return round(flops_per_token * rate / peak, 4) if peak else None

    for run in (steady, with_ckpt):
        run["mfu"] = mfu(run["tokens_per_s"])
    return {
        "preset": preset,
        "vocab_size": args.vocab,
        "seq_len": args.seq_len,
        "global_batch": args.global_batch,
        "micro_batch": micro_batch,
        "micro_batch_probe": probe,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "ckpt_every": args.ckpt_every,
        "bare": {"tokens_per_s": round(bare, 1), "mfu": mfu(bare)},
        "steady": steady,
        "with_ckpt": with_ckpt,
        "full_over_bare": round(with_ckpt["tokens_per_s"] / bare, 4),
        "steady_over_bare": round(steady["tokens_per_s"] / bare, 4),
    }


def pct(value: float | None) -> str:
    return f"{100 * value:.1f}" if value is not None else "n/a"


def summary_line(entry: dict) -> str:
    stalls = entry["with_ckpt"]["stall_ms"]
    return (
        f"tokens/s={entry['steady']['tokens_per_s']:.0f} mfu={pct(entry['steady']['mfu'])}% "
        f"mfu_with_ckpt={pct(entry['with_ckpt']['mfu'])}% stall_ms={max(stalls, default=math.nan):.1f} "
        f"full/bare={entry['full_over_bare']:.3f}"
    )


def write_results(path: Path, header: dict, entries: dict[str, dict]) -> dict:
    """Merge into ``path``: entries of other presets are kept when device and torch are the same."""
    previous = json.loads(path.read_text()) if path.exists() else {}
    same_machine = all(previous.get(k) == header[k] for k in ("device", "torch"))
    presets = {**(previous.get("presets", {}) if same_machine else {}), **entries}
    result = {**header, "presets": presets}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print(
            "gpu_train: no CUDA device; run on a GPU machine (or pass --smoke for a CPU check of the script)"
        )
        return 2
    device = torch.device("cuda" if cuda and not args.smoke else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in MODEL_PRESETS]
    if unknown:
        print(f"gpu_train: unknown preset(s) {', '.join(unknown)}; choose from {', '.join(MODEL_PRESETS)}")
        return 2
    header = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "smoke": args.smoke,
        "levers": {
            "compile": not args.no_compile,
            **levers(args).model_dump(),
            "micro_batch": args.micro_batch,
            "warmup": args.warmup,
            "window": args.window,
        },  # fmt: skip
    }
    entries = {}
    for preset in presets:
        with tempfile.TemporaryDirectory(prefix="gpu-train-", dir=args.work_dir) as tmp:
            entry = measure_preset(args, preset, device, Path(tmp))
        entries[preset] = entry
        write_results(args.out, header, {preset: entry})  # each preset is kept even if a later one fails
        release_memory(device)
        print(f"gpu_train[{preset}]: {summary_line(entry)}", flush=True)
        print(f"  bare {entry['bare']['tokens_per_s']:.0f} tokens/s (mfu {pct(entry['bare']['mfu'])}%), "
              f"peak memory {entry['with_ckpt']['peak_memory_mb']:.0f} MB, data wait "
              f"{100 * entry['with_ckpt']['data_wait_share']:.2f}%, saves at {entry['with_ckpt']['saves_in_window']} "
              f"stalled {entry['with_ckpt']['stall_ms']} ms, final save {entry['steady']['final_save_ms']} ms",
              flush=True)  # fmt: skip
    print(f"gpu_train: {summary_line(entries[presets[0]])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
