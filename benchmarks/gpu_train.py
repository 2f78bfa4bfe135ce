"""GPT-2 124M on one CUDA device: tokens/s and MFU of the full trainer, against a bare loop.

A ready script for a GPU machine (nothing here needs a network): it writes synthetic shards
(vocabulary 50257, 1024-token sequences) into a temporary local repository, then trains the
``gpt2-124m`` preset for ``--steps`` steps twice in this process:

* bare: the same model, torch.compile, bf16 autocast, fused AdamW, batches already on the GPU;
* full: ``training.trainer.train``: shard loader with pinned-memory prefetch, metrics,
  spike checks, asynchronous checkpoints every ``--ckpt-every`` steps, lineage records.

MFU = flops_per_token x tokens/s / peak, with ``flops_per_token = 6 N + 12 L H Q T``
(``GPT.flops_per_token``) and the dense bf16 peak of the device from
``training.metrics.PEAK_BF16_FLOPS`` (H100/H200 SXM: 989 TFLOP/s; A100: 312) or
``--peak-flops``. For reference, llm.c reaches about 50% MFU for GPT-2 124M on A100s and
Megatron-LM quotes up to 47% on H100s.

    .venv/bin/python benchmarks/gpu_train.py [--steps 60] [--micro-batch 16] [--global-batch 64]
    .venv/bin/python benchmarks/gpu_train.py --allow-cpu --preset tiny --seq-len 64 --steps 12   # smoke test

Results go to benchmarks/results/gpu_train.json. Last line:
``gpu_train: tokens/s=<x> mfu=<y>% full/bare=<z>``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from train_loop import bare_loop, full_loop  # noqa: E402  (benchmarks/train_loop.py, beside this file)

from training.config import MODEL_PRESETS, CheckpointConfig, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from training.metrics import peak_flops  # noqa: E402
from training.model import GPT  # noqa: E402
from training.synthetic import publish_synthetic_dataset  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_train.json"
GPT2_VOCAB = 50257


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=list(MODEL_PRESETS), default="gpt2-124m")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15, help="steps left out of the timing (compilation)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=64, help="sequences per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward")
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--peak-flops", type=float, default=None, help="per-device peak, FLOP/s")
    parser.add_argument(
        "--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (smoke test)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu_train: no CUDA device; run on a GPU machine (or pass --allow-cpu for a smoke test)")
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    with tempfile.TemporaryDirectory(prefix="gpu-train-") as tmp:
        home = Path(tmp)
        repo = LocalRepo(home / "repo")
        repo.ensure()
        sequences = args.steps * args.global_batch
        commit = publish_synthetic_dataset(
            repo, "main", {"web": sequences, "code": sequences}, seq_len=args.seq_len, vocab_size=GPT2_VOCAB,
            shards_per_source=4, total_samples=2 * sequences,
        )  # fmt: skip
        config = TrainConfig(
            run="gpu-train", commit=commit, repo=str(home / "repo"), home=str(home), steps=args.steps,
            global_batch=args.global_batch, micro_batch=args.micro_batch, model=ModelConfig.preset(args.preset),
            data=DataConfig(heldout_fraction=0.01), compile=not args.no_compile, eval_every=0, report=False,
            checkpoint=CheckpointConfig(every=args.ckpt_every, keep_last=1), peak_flops=args.peak_flops,
        )  # fmt: skip
        tokens = args.global_batch * args.seq_len
        bare = bare_loop(config, home, commit, "bare", device)[args.warmup :]
        bare_rate = tokens * len(bare) / sum(wall for wall, _ in bare)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        records = full_loop(config)[args.warmup :]
        full_rate = tokens * len(records) / (sum(r["step_ms"] for r in records) / 1000)
        data_wait = sum(r["data_wait_ms"] for r in records) / sum(r["step_ms"] for r in records)
        stalls = [r["ckpt_stall_ms"] for r in records if "ckpt_stall_ms" in r]
        memory_mb = max(r["peak_memory_mb"] for r in records)

    with torch.device("meta"):  # the FLOP count needs the shapes, not the weights
        flops_per_token = GPT(config.model.gpt_config(GPT2_VOCAB, args.seq_len)).flops_per_token(args.seq_len)
    peak = peak_flops(device, args.peak_flops)
    mfu = {
        k: flops_per_token * rate / peak if peak else None
        for k, rate in (("bare", bare_rate), ("full", full_rate))
    }
    result = {
        "config": vars(args),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "tokens_per_s": {"bare": round(bare_rate, 1), "full": round(full_rate, 1)},
        "mfu": mfu,
        "full_over_bare": round(full_rate / bare_rate, 4),
        "data_wait_share": round(data_wait, 5),
        "ckpt_stall_ms": stalls,
        "peak_memory_mb": round(memory_mb, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    def pct(value: float | None) -> str:
        return f"{100 * value:.1f}%" if value is not None else "n/a (no peak known; pass --peak-flops)"

    print(f"| {result['device']} | tokens/s | MFU |\n|---|---|---|")
    print(f"| bare | {bare_rate:.0f} | {pct(mfu['bare'])} |\n| full | {full_rate:.0f} | {pct(mfu['full'])} |")
    print(
        f"data wait {100 * data_wait:.2f}% of step time; checkpoint stalls {stalls} ms; peak memory {memory_mb:.0f} MB"
    )
    print(f"gpu_train: tokens/s={full_rate:.0f} mfu={pct(mfu['full'])} full/bare={full_rate / bare_rate:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
