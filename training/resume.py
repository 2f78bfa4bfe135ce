"""A run's checkpoints as the trainer uses them: the resume policy (fresh, continue, or refuse
another data commit), saves of the declared states, and the rollback targets they leave.

Which states a checkpoint holds is the trainer's declaration (``Trainer.states``); how a
checkpoint is written and verified is :mod:`training.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from formats.layout import checkpoint_record_path, event_record_path
from training.checkpoint import (
    META,
    CheckpointInfo,
    CheckpointManager,
    SaveTiming,
    load_payload,
    newest_valid,
    remove_partial_saves,
)
from training.config import TrainConfig
from training.distributed import DistContext, elastic_restart_count
from training.engine import ModelEngine
from training.errors import TrainingError
from training.faults import FaultInjector
from training.lineage import LineageWriter
from training.runstate import code_version
from training.samples import DataBinding
from training.train_state import States, TrainProgress, collect_states, restore_states, tensor_files


class DataChangeRefused(TrainingError):
    """The newest checkpoint was trained on another data commit and the policy does not allow it."""


def record_checkpoint(
    lineage: LineageWriter, config: TrainConfig, info: CheckpointInfo, if_absent: bool = False
) -> None:
    """Queue the lineage record of a saved checkpoint (checkpoint -> data commit -> flow run)."""
    record = {k: v for k, v in info.meta.items() if k != "config"}
    record["checkpoint"] = str(info.path)
    # enough of the config for `tokenlake lineage --step` to replay the sample order
    # without this machine's checkpoint files
    record["sample_order"] = {
        "global_batch": config.global_batch,
        "heldout_fraction": config.data.heldout_fraction,
    }
    lineage.record(checkpoint_record_path(config.run, info.step), record, if_absent)


class RunCheckpoints:
    def __init__(
        self,
        config: TrainConfig,
        dist: DistContext,
        directory: Path,
        states: States,
        progress: TrainProgress,
        binding: DataBinding,
        engine: ModelEngine,
        manager: CheckpointManager,
        faults: FaultInjector,
        lineage: LineageWriter | None,
        say: Callable[[str], None],
    ):
        self.cfg, self.dist, self.directory, self.states = config, dist, directory, states
        self.progress, self.binding, self.engine, self.manager = progress, binding, engine, manager
        self.faults, self.lineage, self.say = faults, lineage, say
        self.last_metrics: dict[str, Any] = {}
        self.code_version = code_version()

    def _description(self) -> dict[str, Any]:
        """What ``meta.json`` says about a checkpoint besides its state (never loaded back)."""
        return {
            "run": self.cfg.run,
            "world_size": self.dist.world_size,
            "micro_batch": self.engine.micro_batch,
            "data": self.binding.to_dict(),
            "config": self.cfg.model_dump(mode="json"),
            "code_version": self.code_version,
            "flow_run_id": self.cfg.flow_run_id,
            "metrics": self.last_metrics,
            "saved_at": time.time(),
        }

    def save(self) -> SaveTiming:
        """Checkpoint the current step; returns what it cost rank 0 (zeros on other ranks). The
        stall counts everything the training thread did for it: collecting the state dicts too."""
        started = time.perf_counter()
        tensors, state_meta = collect_states(self.states)  # on every rank: some pieces are collectives
        if not self.dist.is_main:
            return SaveTiming(0.0, 0.0, None, 0)
        step = self.progress.step
        timing = self.manager.save(
            step,
            tensors,
            state_meta | self._description(),
            before_complete=lambda: self.faults.kill_point("save", step),
            copied=not self.engine.stages_live_state(),  # then get_state_dict made fresh CPU copies
        )
        timing = dataclasses.replace(timing, stall_s=time.perf_counter() - started)
        if timing.waited_for_step is not None:
            self.say(
                f"the checkpoint of step {step} waited {1000 * timing.waited_s:.0f} ms for the save of step "
                f"{timing.waited_for_step} to be written: saves take longer than checkpoint.every steps"
            )
        return timing

    def find(self, max_step: int | None = None) -> CheckpointInfo | None:
        """Rank 0 verifies; every rank gets its answer (checkpoints sit on a shared filesystem)."""
        found = None
        if self.dist.is_main:
            remove_partial_saves(self.directory)
            found = newest_valid(self.directory, max_step, warn=self.say)
        return self.dist.broadcast(found)

    def load(self, info: CheckpointInfo) -> None:
        restore_states(self.states, load_payload(info, tensor_files(self.states)) | {META: info.meta})

    def resume(self) -> None:
        """Apply the resume policy: start fresh (writing step 0) or continue from the newest valid checkpoint."""
        info = self.find()
        # "never" refuses an earlier run's checkpoints, not those of this job before torchrun restarted it
        if info is not None and self.cfg.resume == "never" and not elastic_restart_count():
            raise TrainingError(
                f"run {self.cfg.run!r} already has checkpoints in {self.directory}; use another run "
                "name, or resume it (--resume auto)"
            )
        if info is None:
            self.say(f"starting fresh on data commit {self.binding.commit[:12]}")
            self.save()  # step 0: the rollback target before the first periodic save
            return
        changed = self.binding.differences(info.meta["data"])
        if changed and self.cfg.resume != "allow-data-change":
            raise DataChangeRefused(
                f"checkpoint {info.path.name} of run {self.cfg.run!r} was trained on data commit "
                f"{info.meta['data']['commit']}, not {self.binding.commit} ({'; '.join(changed)}); "
                "resume with --resume allow-data-change to continue on the new data (it is recorded), "
                "or start a new run"
            )
        self.load(info)
        self.say(f"resumed from {info.path.name} (step {self.progress.step}, {self.progress.tokens} tokens)")
        if self.lineage:
            # A kill between a checkpoint's COMPLETE and the queueing of its lineage record
            # loses the record, and the newest checkpoint is the one that can be affected: queue
            # it again, written only if it is missing (a fork's record of it says more).
            record_checkpoint(self.lineage, self.cfg, info, if_absent=True)
        if changed:
            event = {
                "step": self.progress.step,
                "from": info.meta["data"],
                "to": self.binding.to_dict(),
                "allowed_by": "resume=allow-data-change",
            }
            self.progress.data_changes.append(event)
            self.say(f"continuing on other data, as allowed: {'; '.join(changed)}")
            if self.lineage:
                self.lineage.record(
                    event_record_path(self.cfg.run, "data-change", self.progress.step),
                    {**event, "run": self.cfg.run},
                )
