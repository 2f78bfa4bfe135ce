"""What a training step read: the global sample positions of step N of a run, each with its
source, epoch, shard and row, replayed from lineage records and the data commit alone.

Pure functions over a :class:`~versioning.DataRepo` (no Prefect): the newest checkpoint
before the step gives the loader's cursor, the covering checkpoint its skipped windows, and
the data commit's ``mix.json`` and ``shards/manifest.json`` turn positions into shard rows,
exactly as :mod:`training.data` does during training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flows.lineage import CheckpointRecord, LineageError, read_lineage, training_config
from formats import layout
from formats.mix import MixPlan
from formats.shards import Manifest
from training.data import batch_positions, train_sequence_counts
from versioning import DataRepo


@dataclass(frozen=True)
class SamplePosition:
    position: int  # global sample position (world-size independent)
    source: str
    epoch: int  # that source's epoch
    source_sequence: int  # sequence index within the source
    shard: str  # repository path of the shard holding it
    sequence: int  # row within that shard


@dataclass(frozen=True)
class _SampleSpace:
    """What :func:`training.data.batch_positions` needs of a dataset: the plan and training sequences."""

    plan: MixPlan
    train_sequences: np.ndarray


def _sample_order(config: dict[str, Any]) -> dict[str, Any]:
    """What fixes the sample order, from a full TrainConfig (records before ``sample_order``)."""
    heldout = (config.get("data") or {}).get("heldout_fraction", 0.01)
    return {"global_batch": config["global_batch"], "heldout_fraction": heldout}


def step_positions(repo: DataRepo, checkpoint: CheckpointRecord, step: int) -> list[SamplePosition]:
    """The global sample positions training step ``step`` of ``checkpoint``'s run read, each with
    its source, shard and sequence; replayed from the newest earlier checkpoint's loader state."""
    if not 1 <= step <= checkpoint.step:
        raise LineageError(
            f"step {step} is not one that {checkpoint.name} trained: give a step from 1 to {checkpoint.step}"
        )

    def around(steps: list[int]) -> list[int]:  # the newest checkpoint before the step, the first at or after
        return [
            max((s for s in steps if s < step), default=-1),
            min((s for s in steps if s >= step), default=-1),
        ]

    run = read_lineage(repo, checkpoint.run, select=around).of_run(checkpoint.run)
    start = max((c for c in run if c.step < step), key=lambda c: c.step, default=None)
    covering = min((c for c in run if c.step >= step), key=lambda c: c.step, default=checkpoint)
    order = checkpoint.record.get("sample_order") or _sample_order(training_config(checkpoint))
    global_batch = int(order["global_batch"])
    plan = MixPlan.from_json(repo.get(covering.data_commit, layout.MIX))
    manifest = Manifest.from_json(repo.get(covering.data_commit, layout.MANIFEST))
    space = _SampleSpace(plan, train_sequence_counts(plan, float(order["heldout_fraction"])))
    # Skipped windows only grow, and each lies past the checkpoint it was added at, so the
    # covering checkpoint's list is the one that held for every step up to it.
    skipped = [tuple(w) for w in covering.record.get("loader", {}).get("skipped", [])]
    cursor = int(start.record["loader"]["cursor"]) if start else 0
    for _ in range((start.step if start else 0) + 1, step):
        _, cursor = batch_positions(space, cursor, global_batch, skipped)
    positions, _ = batch_positions(space, cursor, global_batch, skipped)
    return locate_positions(plan, manifest, positions)


def locate_positions(plan: MixPlan, manifest: Manifest, positions: np.ndarray) -> list[SamplePosition]:
    source, epoch, index = plan.locate(positions)
    shard_tables = []
    for name in plan.source_names:
        entries = manifest.shards_of(name)
        shard_tables.append((entries, np.cumsum([0] + [e.sequences for e in entries])))
    found = []
    for p, s, e, k in zip(positions.tolist(), source.tolist(), epoch.tolist(), index.tolist(), strict=True):
        entries, starts = shard_tables[s]
        shard = int(np.searchsorted(starts, k, side="right")) - 1
        found.append(
            SamplePosition(p, plan.source_names[s], e, k, entries[shard].name, k - int(starts[shard]))
        )
    return found
