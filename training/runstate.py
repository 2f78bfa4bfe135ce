"""Run state that is not a tensor of the model: LR schedule, RNG streams, determinism, code version.

Everything here round-trips through a checkpoint loaded with ``weights_only=True``.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import random
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from training.config import OptimConfig


class WarmupCosine:
    """Linear warmup to ``lr``, cosine decay to ``min_lr`` at ``decay_steps``, then flat.

    A pure function of the step; its parameters are checkpointed and win on resume, so a
    resumed run follows the schedule it started with."""

    def __init__(self, optim: OptimConfig, steps: int):
        self.params = {
            "lr": optim.lr,
            "min_lr": optim.min_lr,
            "warmup_steps": optim.warmup_steps,
            "decay_steps": optim.decay_steps or steps,
        }

    def lr(self, step: int) -> float:
        p = self.params
        if step < p["warmup_steps"]:
            return p["lr"] * (step + 1) / p["warmup_steps"]
        if step >= p["decay_steps"]:
            return p["min_lr"]
        progress = (step - p["warmup_steps"]) / max(1, p["decay_steps"] - p["warmup_steps"])
        return p["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (p["lr"] - p["min_lr"])

    def state_dict(self) -> dict:
        return dict(self.params)

    def load_state_dict(self, state: dict) -> None:
        self.params = dict(state)


def rng_state(device: torch.device) -> dict:
    """Python, numpy, torch and CUDA generator states, in types ``weights_only`` loads."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def autocast_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype a config names; ``auto`` is bfloat16 on CUDA and float32 (no autocast) on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextmanager
def deterministic_kernels(enabled: bool):
    """Deterministic algorithms for the duration of a run (restored after, for in-process callers)."""
    previous = torch.are_deterministic_algorithms_enabled()
    if enabled == previous:  # the switch imports torch._inductor (seconds): only flip it when asked
        yield
        return
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it to be deterministic
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def code_version() -> str:
    """``tokenlake <version>`` plus the git commit of the source tree when there is one."""
    try:
        version = importlib.metadata.version("tokenlake")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return f"tokenlake {version}" + (f" ({described})" if described else "")
