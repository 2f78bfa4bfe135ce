"""Training metrics: JSONL records, a console progress bar, and at the end a table and a plot.

Throughput: ``tokens_per_s`` = global tokens of a step / the step's wall time (from the end
of the previous step to the end of this one, so data waits, evaluation and checkpoint
stalls count). ``data_wait_share`` = the time the step waited for the loader / that time.
``cpu_ms`` = CPU time of the whole process (every thread: loader, checkpoint writer) in it.

FLOPs: ``flops_per_token = 6 N + 12 L H Q T`` (``GPT.flops_per_token``: forward and
backward of the matmuls with N non-embedding parameters, plus attention). Achieved
``flops_per_s = flops_per_token * tokens_per_s`` over all ranks. MFU = achieved / (peak of
one device x world size); the peak is dense bf16 tensor-core throughput from
:data:`PEAK_BF16_FLOPS` (or ``TrainConfig.peak_flops``). On a CPU, or a GPU not in the
table, only the achieved FLOP/s is reported (``mfu`` is null).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch
from tqdm import tqdm

PEAK_BF16_FLOPS = {  # dense bf16, per device, from the vendors' datasheets (no sparsity)
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is 756e12
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "L4": 121e12,
}


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated on CUDA; peak resident memory of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class EventSink(Protocol):
    """Also receives every record (TensorBoard: :class:`training.tensorboard_log.TensorBoardLog`)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsLog:
    """Rank 0's metrics: appended to ``metrics.jsonl`` (a resumed run appends; replayed steps
    appear again and the last record of a step is the one that counts)."""

    def __init__(
        self,
        path: Path,
        total_steps: int,
        first_step: int,
        progress: bool,
        tensorboard: EventSink | None = None,
    ):
        self.path = path
        self._tensorboard = tensorboard
        self._file = open_jsonl_for_append(path)
        self._bar = tqdm(
            total=total_steps,
            initial=first_step,
            desc="train",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        self._progress = progress
        self._print_every = max(1, total_steps // 20)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self._tensorboard:
            self._tensorboard.write(record)
        if record.get("kind") == "train":
            self._show(record)
        elif record.get("kind") in ("eval", "rollback", "resume"):
            text = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("kind", "time"))
            if self._progress:
                self._bar.write(f"{record['kind']}: {text}")
            else:
                print(f"{record['kind']}: {text}", flush=True)

    def _show(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self._progress:
            self._bar.n = step  # replays after a resume or a rollback move it back
            self._bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False
            )
            self._bar.update(0)  # redraws at most every mininterval
        elif step % self._print_every == 0 or step == self._bar.total:
            print(
                f"step {step}/{self._bar.total} loss {record['loss']:.4f} "
                f"tokens/s {record['tokens_per_s']:.0f} data wait {100 * record['data_wait_share']:.1f}%",
                flush=True,
            )

    def close(self) -> None:
        self._bar.close()
        self._file.close()
        if self._tensorboard:
            self._tensorboard.close()


def open_jsonl_for_append(path: Path) -> TextIO:
    """``path`` opened to append JSON lines, after cutting off a torn last line.

    A process killed inside a ``write`` can leave a line without its newline; appending to it
    would glue the next run's first record onto it and make the file unreadable. A line
    without its newline is a record that was never completely written, so it goes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        end = f.seek(0, os.SEEK_END)
        keep = end
        while keep > 0:
            start = max(0, keep - (64 << 10))
            f.seek(start)
            chunk = f.read(keep - start)
            if end == keep and chunk.endswith(b"\n"):
                break  # the common case: nothing torn
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        if keep != end:
            f.truncate(keep)
    return path.open("a")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every complete record; a last line without its newline (being written, or torn) is left out."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    lines.pop()  # what follows the last newline: nothing, or an incomplete record
    return [json.loads(line) for line in lines if line.strip()]


def last_per_step(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The final record of each step of one kind, in step order (replays overwrite)."""
    by_step = {r["step"]: r for r in records if r.get("kind") == kind}
    return [by_step[s] for s in sorted(by_step)]


def summarize(records: list[dict[str, Any]], skip_first: int = 2) -> dict[str, Any]:
    """Headline numbers of a run; medians skip the first steps of each process (warm-up, compile).

    Per source of the mix: the last held-out loss (``eval_loss/<source>``) and its change since
    the evaluation before (``eval_loss_change/<source>``; at or above 0, that source's loss has
    stopped falling). ``eval_share``: the evaluations' part of the run's step time."""
    train = last_per_step(records, "train")
    evals = last_per_step(records, "eval")
    steady = [r for r in train if r.get("steps_in_process", skip_first + 1) > skip_first] or train
    stalls = [r["ckpt_stall_ms"] for r in train if "ckpt_stall_ms" in r]
    eval_times = [r["eval_ms"] for r in evals if "eval_ms" in r]

    def median(key: str) -> float | None:
        values = [r[key] for r in steady if r.get(key) is not None]
        return statistics.median(values) if values else None

    step_time = sum(r["step_ms"] for r in train)
    return {
        "steps": train[-1]["step"] if train else 0,
        "tokens": train[-1]["tokens"] if train else 0,
        "final_loss": train[-1]["loss"] if train else None,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        **_per_source_evaluation(evals),
        "tokens_per_s": median("tokens_per_s"),
        "step_ms": median("step_ms"),
        "data_wait_share": median("data_wait_share"),
        "flops_per_s": median("flops_per_s"),
        "mfu": median("mfu"),
        "peak_memory_mb": max((r["peak_memory_mb"] for r in train), default=None),
        "ckpt_stall_ms": statistics.median(stalls) if stalls else None,
        "eval_ms": statistics.median(eval_times) if eval_times else None,
        "eval_share": sum(r.get("eval_ms", 0.0) for r in train) / step_time if step_time else None,
        "rollbacks": sum(1 for r in records if r.get("kind") == "rollback"),
    }


def _per_source_evaluation(evals: list[dict[str, Any]]) -> dict[str, float | None]:
    if not evals:
        return {}
    last = evals[-1].get("eval_loss_by_source", {})
    before = evals[-2].get("eval_loss_by_source", {}) if len(evals) > 1 else {}
    rows: dict[str, float | None] = {f"eval_loss/{name}": loss for name, loss in last.items()}
    rows.update(
        {
            f"eval_loss_change/{name}": loss - before[name] if name in before else None
            for name, loss in last.items()
        }
    )
    return rows


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table."""

    def fmt(key: str, value: Any) -> str:
        if value is None:
            return "n/a"
        if key in ("data_wait_share", "mfu", "eval_share"):
            return f"{100 * value:.2f}%"
        if key == "flops_per_s":
            return f"{value / 1e12:.3f} TFLOP/s" if value >= 1e11 else f"{value / 1e9:.2f} GFLOP/s"
        if key.startswith("eval_loss_change/"):
            return f"{value:+.4g}"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    rows = "\n".join(f"| {key} | {fmt(key, value)} |" for key, value in summary.items())
    return "| metric | value |\n|---|---|\n" + rows + "\n"


def loss_lines(records: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """The lines of the loss plot by label: train, held-out overall, then one per source (by name:
    the records hold them sorted)."""
    train = last_per_step(records, "train")
    evals = last_per_step(records, "eval")
    lines = {"train": ([r["step"] for r in train], [r["loss"] for r in train])}
    if evals:
        lines["eval (held out)"] = ([r["step"] for r in evals], [r["eval_loss"] for r in evals])
    names = dict.fromkeys(name for r in evals for name in r.get("eval_loss_by_source", {}))
    for name in names:
        scored = [r for r in evals if name in r.get("eval_loss_by_source", {})]
        lines[f"eval: {name}"] = (
            [r["step"] for r in scored],
            [r["eval_loss_by_source"][name] for r in scored],
        )
    return lines


def plot_run(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Loss (train, held out, held out per source) and throughput against the step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = last_per_step(records, "train")
    fig, (ax_loss, ax_speed) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for label, (steps, values) in loss_lines(records).items():
        if label == "train":
            ax_loss.plot(steps, values, label=label, linewidth=1)
        elif label.startswith("eval: "):
            ax_loss.plot(steps, values, ".--", label=label, linewidth=1)
        else:
            ax_loss.plot(steps, values, "o-", label=label)
    for r in records:
        if r.get("kind") == "rollback":
            ax_loss.axvline(r["at_step"], color="red", alpha=0.4, linestyle="--")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize="small")
    ax_loss.set_title(title)
    ax_speed.plot([r["step"] for r in train], [r["tokens_per_s"] for r in train], linewidth=1)
    ax_speed.set_ylabel("tokens/s")
    ax_speed.set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
