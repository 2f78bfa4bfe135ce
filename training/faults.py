"""Injected faults for the crash and stability tests (``TrainConfig.faults``; empty by default).

A kill is a real ``SIGKILL`` of every training process (rank 0 gathers the peers' pids at
start and kills them, then itself), fired once per run: a marker file under
``<run>/faults/`` is written first, so the restarted run goes past that point.

A kill inside a step first lets a checkpoint save in flight become durable (``settle``):
otherwise whether the previous checkpoint survives depends on how fast the machine is, and
the resume point of a test would too. A kill during a save is its own fault
(``kill_in_save_at_steps``), and kills at random moments are the chaos campaign's
(``benchmarks/chaos/train_kills.py``).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np

from training.config import FaultConfig

SPIKE_FACTOR = 1000.0


class FaultInjector:
    def __init__(
        self,
        config: FaultConfig,
        run_dir: Path,
        pids: list[int],
        is_main: bool,
        settle: Callable[[], None] = lambda: None,
    ):
        self.config = config
        self.marker_dir = run_dir / "faults"
        self.pids = pids
        self.is_main = is_main
        self.settle = settle

    def kill_point(self, kind: str, step: int) -> None:
        """Kill every rank here if ``kind`` ("step" or "save") is configured for ``step``, once."""
        steps = self.config.kill_at_steps if kind == "step" else self.config.kill_in_save_at_steps
        if not self.is_main or step not in steps:
            return
        marker = self.marker_dir / f"killed-{kind}-{step}"
        if marker.exists():
            return
        if kind == "step":
            self.settle()
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        with marker.open("w") as f:
            f.write(f"SIGKILL of pids {self.pids}\n")
            f.flush()
            os.fsync(f.fileno())
        me = os.getpid()
        for pid in self.pids:
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.kill(me, signal.SIGKILL)

    def loss_factor(self, positions: np.ndarray) -> float | None:
        """What to multiply the loss by when the batch holds a poisoned position (None: nothing)."""
        if self.config.nan_at_positions and np.isin(positions, self.config.nan_at_positions).any():
            return math.nan
        if self.config.spike_at_positions and np.isin(positions, self.config.spike_at_positions).any():
            return SPIKE_FACTOR
        return None
