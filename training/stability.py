"""Loss-spike and non-finite detection: decides when the trainer must roll back.

The trainer judges each step before the optimizer applies it: a non-finite loss or
gradient norm, or a loss whose z-score over the trailing window of good losses exceeds
the threshold, is a bad step. The trainer then reloads the last good checkpoint and
skips the data window of the bad step (see ``training.loop``). The trailing window is
part of every checkpoint, so a resumed run judges the same steps the same way.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    zscore: float | None = None


@dataclass(frozen=True)
class Rollback:
    """One rollback: recorded in every later checkpoint and as a lineage event."""

    at_step: int  # the step that was judged bad (1-based: the step it would have completed)
    to_step: int  # the checkpoint training went back to
    window_start: int  # skipped global sample positions [window_start, window_end)
    window_end: int
    reason: str
    loss: float

    def to_dict(self) -> dict:
        return asdict(self)


class SpikeDetector:
    """One-sided z-score of the loss against the trailing window of accepted losses."""

    def __init__(self, window: int, zscore: float, min_history: int):
        self.threshold = zscore
        self.min_history = min_history
        self.losses: deque[float] = deque(maxlen=window)

    def judge(self, loss: float, grad_norm: float) -> Verdict:
        if not math.isfinite(loss):
            return Verdict(False, f"non-finite loss ({loss})")
        if not math.isfinite(grad_norm):
            return Verdict(False, f"non-finite gradient norm ({grad_norm})")
        if len(self.losses) < self.min_history:
            return Verdict(True)
        history = torch.tensor(list(self.losses), dtype=torch.float64)
        # A floor on the spread keeps a flat plateau from turning noise into a "spike".
        std = max(float(history.std()), 1e-3 * abs(float(history.mean())), 1e-12)
        z = (loss - float(history.mean())) / std
        if z > self.threshold:
            return Verdict(False, f"loss spike ({loss:.4g}, z-score {z:.1f} > {self.threshold})", z)
        return Verdict(True, zscore=z)

    def accept(self, loss: float) -> None:
        self.losses.append(loss)

    def state_dict(self) -> dict:
        return {"losses": torch.tensor(list(self.losses), dtype=torch.float64)}

    def load_state_dict(self, state: dict) -> None:
        self.losses.clear()
        self.losses.extend(float(x) for x in state["losses"].tolist())
