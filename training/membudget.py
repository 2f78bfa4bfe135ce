"""Choose the micro-batch from device memory instead of a fixed number (CUDA only).

Larger micro-batches mean larger matmuls and fewer launches per optimizer step, so up to
the point where memory runs out they raise throughput. :func:`choose_micro_batch` measures
rather than estimates: it runs one forward and backward pass of the real model, in the
run's autocast dtype, on random tokens, for each candidate from the largest down, and takes
the first whose peak allocated memory plus the optimizer's state (allocated at the first
step, not yet during the probe) stays within ``1 - headroom`` of the device's memory. A
candidate that runs out of memory simply does not fit. The candidates are the divisors of
the per-rank batch, so the global batch and the data order do not change.

The probe runs the model uncompiled and unsharded, which needs at least as much memory as
the compiled or FSDP-sharded model does, so the choice errs on the safe side. It leaves no
gradients behind and does not advance any random number generator the run uses.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

from training.errors import TrainingError

ADAMW_STATE_PER_PARAMETER_BYTE = 2  # exp_avg and exp_avg_sq, each the parameter's size


@dataclass(frozen=True)
class MicroBatchChoice:
    micro_batch: int
    budget_bytes: int  # what the probe allowed: (1 - headroom) x device memory
    reserved_bytes: int  # set aside for the optimizer state
    peak_bytes: dict[int, int | None] = field(
        default_factory=dict
    )  # per candidate tried; None: out of memory

    def to_dict(self) -> dict:
        return {
            "micro_batch": self.micro_batch,
            "budget_bytes": self.budget_bytes,
            "reserved_bytes": self.reserved_bytes,
            "peak_bytes": {str(k): v for k, v in self.peak_bytes.items()},
        }


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_micro_batch(
    model: torch.nn.Module,
    per_rank_batch: int,
    seq_len: int,
    vocab_size: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
    headroom: float,
) -> MicroBatchChoice:
    """The largest divisor of ``per_rank_batch`` whose training step fits with ``headroom`` to spare."""
    if device.type != "cuda":
        raise ValueError("the micro-batch probe measures CUDA memory; on another device set micro_batch")
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(total * (1 - headroom))
    reserved = ADAMW_STATE_PER_PARAMETER_BYTE * sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
    )
    peaks: dict[int, int | None] = {}
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.random.fork_rng(devices=[device]):  # dropout in the probe must not move the run's RNG
        for candidate in sorted(divisors(per_rank_batch), reverse=True):
            peaks[candidate] = _peak_of_step(
                model, candidate, seq_len, vocab_size, device, autocast, generator
            )
            if peaks[candidate] is not None and peaks[candidate] + reserved <= budget:
                return MicroBatchChoice(candidate, budget, reserved, peaks)
    raise TrainingError(
        f"not even micro-batch 1 fits: one sequence of {seq_len} tokens needs "
        f"{_gib(peaks.get(1))} plus {_gib(reserved)} of optimizer state, over the budget of {_gib(budget)} "
        f"({100 * (1 - headroom):.0f}% of {_gib(total)}); use a smaller model, a shorter sequence, or FSDP"
    )


def _peak_of_step(model, micro_batch, seq_len, vocab_size, device, autocast, generator) -> int | None:
    tokens = torch.randint(0, vocab_size, (micro_batch, seq_len + 1), device=device, generator=generator)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with autocast():
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    except torch.OutOfMemoryError:
        return None
    finally:
        model.zero_grad(set_to_none=True)
        del tokens
        torch.cuda.empty_cache()


def _gib(value: int | None) -> str:
    return "more memory than there is" if value is None else f"{value / 2**30:.1f} GiB"
