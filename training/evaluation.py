"""Held-out evaluation: the loss over all held-out sequences and the loss of each source of the mix.

Each held-out sequence is a (source, index) pair of the commit's sample space
(:meth:`~training.samples.TokenDataset.heldout_ids`, round-robin over the sources), so a
sequence knows its source without asking the loader. The set is a pure function of the
commit, ``heldout_fraction``, ``eval_sequences`` and ``global_batch``: every evaluation of a
run, on any world size and after any resume, scores the same sequences, and nothing here is
state a checkpoint needs to hold.

Every rank scores its slice of each global batch (the ranks' slices, as in training), one
summed loss per sequence; the sums and token counts are added per source on the device and
all-reduced once, so a source's loss is the mean over its tokens on any world size. The
overall loss is the mean over every token, so it weighs each source by its held-out tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from training.distributed import DistContext
from training.engine import ModelEngine
from training.samples import TokenDataset


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean next-token cross-entropy over every held-out token
    by_source: dict[str, float]  # the same per source of the mix (sources with held-out sequences)
    tokens_by_source: dict[str, int]
    seconds: float  # wall time of the evaluation on this rank, the all-reduce included

    def record(self, step: int) -> dict:
        """The ``eval`` record of ``metrics.jsonl``."""
        return {
            "kind": "eval",
            "step": step,
            "eval_loss": self.loss,
            "eval_loss_by_source": self.by_source,
            "eval_tokens_by_source": self.tokens_by_source,
            "eval_ms": 1000 * self.seconds,
            "time": time.time(),
        }


class HeldoutEvaluation:
    """The held-out sequences of a run, scored in whole global batches, per source."""

    def __init__(
        self,
        dataset: TokenDataset,
        ids: tuple[np.ndarray, np.ndarray],
        global_batch: int,
        my_slice: Callable[[np.ndarray], np.ndarray],
    ):
        self.dataset, self.global_batch, self.my_slice = dataset, global_batch, my_slice
        self.sources, self.indices = ids
        self.source_names = dataset.plan.source_names

    def __len__(self) -> int:
        return len(self.sources)

    def run(self, engine: ModelEngine, dist: DistContext) -> EvalResult:
        started = time.perf_counter()
        # per source: [summed loss, tokens], float64 so that sums over many tokens stay exact enough
        totals = torch.zeros(len(self.source_names), 2, dtype=torch.float64, device=engine.device)
        engine.model.eval()
        with torch.no_grad():
            for start in range(0, len(self.sources), self.global_batch):
                mine = self.my_slice(np.arange(start, start + self.global_batch))
                rows = torch.from_numpy(self.dataset.rows(self.sources[mine], self.indices[mine]))
                sources = torch.from_numpy(self.sources[mine]).to(engine.device)
                rows = rows.to(engine.device).view(engine.accumulation, engine.micro_batch, -1)
                for micro, micro_sources in zip(rows, sources.view(engine.accumulation, -1), strict=True):
                    losses = sequence_losses(engine, micro)
                    totals[:, 0].index_add_(0, micro_sources, losses.double())
                    totals[:, 1].index_add_(
                        0, micro_sources, torch.full_like(losses, micro.size(1) - 1, dtype=torch.float64)
                    )
        engine.model.train()
        summed, tokens = dist.sum(totals).cpu().unbind(1)
        present = [i for i in range(len(self.source_names)) if tokens[i] > 0]
        return EvalResult(
            loss=float(summed.sum() / tokens.sum()),
            by_source={self.source_names[i]: float(summed[i] / tokens[i]) for i in present},
            tokens_by_source={self.source_names[i]: int(tokens[i]) for i in present},
            seconds=time.perf_counter() - started,
        )


def sequence_losses(engine: ModelEngine, micro: torch.Tensor) -> torch.Tensor:
    """The summed next-token cross-entropy of each sequence of ``micro`` ([B, T + 1] token ids).

    The model runs without targets, so it returns the logits (with ``loss_chunk_tokens`` the
    training forward would not); the fp32 softmax is taken one sequence at a time, so at
    most one sequence's fp32 logits exist besides the micro-batch's logits in the autocast
    dtype (no activations are kept under ``no_grad``: far below a training step's peak)."""
    inputs, targets = micro[:, :-1], micro[:, 1:]
    with engine.autocast:
        logits, _ = engine.model(inputs)
    return torch.stack(
        [F.cross_entropy(logits[row].float(), targets[row], reduction="sum") for row in range(micro.size(0))]
    )
