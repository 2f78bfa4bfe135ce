"""Seeded fault injection: 503 answers, dropped connections and added latency.

Every request draws once from one seeded RNG, so a single-threaded client sees the same
faults on the same requests in every run. A dropped request is dropped either before it
is handled or after (the work is done, the response is lost): the second case is what
makes a client's retried writes prove they are idempotent.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class FaultConfig:
    error_rate: float = 0.0  # fraction of requests answered 503
    drop_rate: float = 0.0  # fraction of requests whose connection closes without a response
    latency_s: float = 0.0  # added before every response
    seed: int = 0
    operations: frozenset[str] | None = None  # operationIds the faults hit; None: every operation

    def __post_init__(self) -> None:
        if not (
            0 <= self.error_rate <= 1 and 0 <= self.drop_rate <= 1 and self.error_rate + self.drop_rate <= 1
        ):
            raise ValueError(f"fault rates must be fractions summing to at most 1: {self}")
        if self.latency_s < 0:
            raise ValueError(f"latency must be non-negative: {self}")


class Fault(Enum):
    NONE = "none"
    ERROR = "error"  # answer 503 without doing the work
    DROP_BEFORE = "drop_before"  # close the connection without doing the work
    DROP_AFTER = "drop_after"  # do the work, then close the connection without answering


class FaultInjector:
    def __init__(self, config: FaultConfig):
        self.config = config
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()

    def draw(self, operation_id: str, may_answer_503: bool) -> Fault:
        """The fault for the next request; ``may_answer_503`` is False where the spec has no 5xx answer."""
        if self.config.operations is not None and operation_id not in self.config.operations:
            return Fault.NONE
        with self._lock:
            roll, coin = self._rng.random(), self._rng.random()
            if roll < self.config.drop_rate:
                fault = Fault.DROP_AFTER if coin < 0.5 else Fault.DROP_BEFORE
            elif roll < self.config.drop_rate + self.config.error_rate and may_answer_503:
                fault = Fault.ERROR
            else:
                fault = Fault.NONE
            if fault is not Fault.NONE:
                self.injected[fault.value] += 1
            return fault
