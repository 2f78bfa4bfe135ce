"""A rule is a signal column and a bound on it; a document that leaves the bound fails the
rule, and a dropped document's reason is the first rule (in declaration order) it fails."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator


class Bounds(BaseModel):
    """Keep where ``min <= signal <= max``; a missing bound does not constrain. Both missing: rule off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"bounds min ({self.min}) exceeds max ({self.max})")
        return self

    @property
    def active(self) -> bool:
        return self.min is not None or self.max is not None

    def fails(self, signal: np.ndarray) -> np.ndarray:
        """True where the signal is out of bounds (NaN counts as out of bounds)."""
        fails = np.isnan(signal) if self.active else np.zeros(len(signal), dtype=bool)
        if self.min is not None:
            fails |= signal < self.min
        if self.max is not None:
            fails |= signal > self.max
        return fails


def first_failures(failures: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The name of each document's first failing rule, or None: an object array of length n."""
    reasons = np.full(n, None, dtype=object)
    for name, failed in reversed(failures.items()):
        reasons[failed] = name
    return reasons
