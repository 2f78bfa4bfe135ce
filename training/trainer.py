"""The trainer: one process of a (possibly single-process) DDP or FSDP2 job, assembled from its
parts: the inputs (data commit, shard stream, loader: :mod:`training.inputs`), the model and
its optimizer (:mod:`training.engine`), the states a checkpoint holds (declared here, saved and
resumed by :mod:`training.resume`), and the step loop (:mod:`training.loop`).

Exactness: model init, data order, RNG states, optimizer and schedule all resume from the
checkpoint, and CPU runs use deterministic kernels, so a run killed at any moment and
restarted produces the same losses and weights, bit for bit, as one that never stopped.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from formats.layout import event_record_path
from training.checkpoint import META, CheckpointManager, list_checkpoints
from training.config import TrainConfig
from training.distributed import DistContext, close_distributed, init_distributed
from training.engine import ModelEngine
from training.errors import TrainingError
from training.faults import FaultInjector
from training.inputs import TrainInputs
from training.lineage import LineageWriter
from training.loop import StepLoop
from training.metrics import (
    MetricsLog,
    open_jsonl_for_append,
    plot_run,
    read_metrics,
    summarize,
    summary_table,
)
from training.resume import RunCheckpoints, record_checkpoint
from training.runlock import RunBusy, RunLock
from training.runstate import deterministic_kernels
from training.stability import SpikeDetector
from training.train_state import ModelState, OptimizerState, RNGState, Slot, States, TrainProgress
from versioning import DataRepo, TransientError, default_repo_spec, open_repo


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    step: int
    tokens: int
    summary: dict[str, Any]
    checkpoint: str | None


class Trainer:
    def __init__(self, config: TrainConfig, dist: DistContext):
        self.cfg = config
        self.dist = dist
        self.run_dir = config.run_dir()
        self.checkpoint_dir = self.run_dir / "checkpoints"
        config.accumulation_steps(dist.world_size)  # a global batch that does not divide fails here
        self._check_tensorboard()
        self.run_lock = self._lock_run()
        self.repo_spec = config.repo or default_repo_spec()
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
        self.inputs: TrainInputs | None = None
        self.metrics: MetricsLog | None = None
        # the order matters: the model's initialisation draws from the RNG it seeds, after the data
        try:
            self.inputs = TrainInputs(config, dist, self.repo_spec, self.say)
            manifest = self.inputs.dataset.manifest
            self.engine = ModelEngine(config, dist, manifest.vocab_size, manifest.seq_len, self.say)
            self.loader = self.inputs.start_loader(self.engine.micro_batch, self._data_event)
            self._declare_states()
        except (
            BaseException
        ):  # loader processes, fetch threads and the run lock must not outlive a failed start
            self._close_failed_start()
            raise
        self.samples_log = (
            open_jsonl_for_append(self.run_dir / f"samples-rank{dist.rank}-of-{dist.world_size}.jsonl")
            if config.log_samples
            else None
        )
        self.loop = StepLoop(
            config, dist, self.engine, self.inputs, self.progress, self.detector, self.checkpoints,
            self.faults, self.lineage, self.samples_log, self.say,
        )  # fmt: skip

    def _close_failed_start(self) -> None:
        if self.inputs is not None:
            self.inputs.close()
        if self.run_lock:
            self.run_lock.release()
            self.run_lock = None

    def _declare_states(self) -> None:
        """What a checkpoint holds (``states``), where it goes, and what is recorded about it."""
        config, dist, engine = self.cfg, self.dist, self.engine
        self.progress = TrainProgress()
        self.detector = SpikeDetector(
            config.stability.window, config.stability.zscore, config.stability.min_history
        )
        live = engine.stages_live_state()
        # Every piece of state a checkpoint holds, and where: saving and loading both walk this
        # (training/train_state.py). Loading goes in this order: progress before the RNG.
        self.states: States = {
            "progress": (self.progress, Slot(META)),  # step, tokens, rollbacks, data changes
            "loader": (self.loader, Slot(META, "loader")),  # sample cursor, skipped windows
            "model": (ModelState(engine.raw_model, live=live), Slot("model.pt")),
            "optimizer": (OptimizerState(engine.raw_model, engine.optimizer, live=live), Slot("optim.pt")),
            "schedule": (engine.schedule, Slot("state.pt", "schedule")),
            "scaler": (engine.scaler, Slot("state.pt", "scaler")),
            "detector": (self.detector, Slot("state.pt", "detector")),
            "rng": (RNGState(dist, engine.device, config.seed, self.progress), Slot("state.pt", "rng")),
        }
        self.lineage = (
            LineageWriter(
                self._open_lineage_repo, config.run, self.run_dir / "lineage-queue", warn=self.say
            ).start()
            if dist.is_main
            else None
        )
        manager = CheckpointManager(
            self.checkpoint_dir,
            config.checkpoint.keep_last,
            config.checkpoint.milestone_every,
            config.checkpoint.async_save,
            on_saved=functools.partial(record_checkpoint, self.lineage, config) if dist.is_main else None,
            device=engine.device,
        )
        # A checkpoint being staged reads the parameters and the optimizer state on a side
        # stream; the optimizer step must not change them before that copy is done.
        engine.optimizer.register_step_pre_hook(lambda *_: manager.fence())
        self.faults = FaultInjector(
            config.faults, self.run_dir, dist.gather(os.getpid()), dist.is_main, settle=manager.wait
        )
        self.checkpoints = RunCheckpoints(
            config, dist, self.checkpoint_dir, self.states, self.progress, self.inputs.binding, engine,
            manager, self.faults, self.lineage, self.say,
        )  # fmt: skip

    def _open_lineage_repo(self) -> DataRepo:
        if self.cfg.faults.lineage_outage:
            raise TransientError("injected fault (faults.lineage_outage): the repository is unreachable")
        return open_repo(self.repo_spec, create=False)

    def _check_tensorboard(self) -> None:
        """With ``tensorboard`` on, rank 0 (the one that writes) needs the package; every rank stops
        with its sentence before any data is read. Off, nothing of it is imported."""
        if not self.cfg.tensorboard:
            return
        refusal = None
        if self.dist.is_main:
            from training.tensorboard_log import require_tensorboard

            try:
                require_tensorboard()
            except TrainingError as exc:
                refusal = str(exc)
        refusal = self.dist.broadcast(refusal)
        if refusal:
            raise TrainingError(refusal)

    def _lock_run(self) -> RunLock | None:
        """Rank 0 holds the run; every rank refuses together when another trainer has it."""
        lock, refusal = None, None
        if self.dist.is_main:
            try:
                lock = RunLock(self.run_dir, self.cfg.run, self.cfg.flow_run_id).acquire()
            except RunBusy as exc:
                refusal = str(exc)
        refusal = self.dist.broadcast(refusal)
        if refusal:
            raise RunBusy(refusal)
        return lock

    def say(self, message: str) -> None:
        if self.dist.is_main:
            print(f"[train {self.cfg.run}] {message}", flush=True)

    def _data_event(self, record: dict[str, Any]) -> None:
        """A loader's report (a step waiting for data, a loader taken over): said, and in the metrics."""
        self.say(record["message"])
        if self.metrics:
            self.metrics.write({**record, "step": self.progress.step + 1, "time": time.time()})

    def _record_reverted_data(self) -> None:
        """Training on data a rollback reverted was allowed: say so, and record it in the run's lineage."""
        reverted = self.inputs.reverted
        if reverted is None or not self.dist.is_main:
            return
        self.say(f"training on reverted data, as allowed (allow_reverted): {reverted.reason}")
        if self.lineage:
            event = {**reverted.to_dict(), "run": self.cfg.run, "step": self.progress.step,
                     "allowed_by": "allow_reverted"}  # fmt: skip
            self.lineage.record(event_record_path(self.cfg.run, "reverted-data", self.progress.step), event)

    def run(self) -> TrainResult:
        self.checkpoints.resume()
        self._record_reverted_data()
        if self.dist.is_main:
            self.metrics = MetricsLog(
                self.run_dir / "metrics.jsonl",
                self.cfg.steps,
                self.progress.step,
                self.cfg.progress,
                tensorboard=self._open_tensorboard(),
            )
            self.metrics.write(
                {
                    "kind": "resume",
                    "step": self.progress.step,
                    "world_size": self.dist.world_size,
                    "micro_batch": self.engine.micro_batch,
                    "data_commit": self.inputs.binding.commit,
                    "time": time.time(),
                }
            )
        self.loop.run(self.metrics)
        return self._finish()

    def _open_tensorboard(self) -> Any:
        if not self.cfg.tensorboard:
            return None
        from training.tensorboard_log import TensorBoardLog

        return TensorBoardLog(self.run_dir, self.progress.step)

    def close(self) -> None:
        """Stop the loader, finish a save in flight, give queued lineage a last try (also after an error).

        The DDP wrapper goes first, while the process group is still registered: its C++
        reducer holds the group, and if the reducer were the group's last owner, the group's
        destructor would run under the GIL and wait for a gloo worker thread that needs the
        GIL to free a finished collective's tensors (a hang at exit, found by the chaos
        campaign). Freed here, the group is destroyed later by ``destroy_process_group``,
        whose binding lets go of the GIL first."""
        self.engine.unwrap()
        self.inputs.close()
        if self.metrics:
            self.metrics.write(
                {
                    "kind": "data",
                    **self.loader.report(),
                    "cache": self.inputs.cache.stats(),
                    "time": time.time(),
                }
            )
        if self.samples_log:
            self.samples_log.close()
            self.samples_log = None
        if self.dist.is_main:
            try:
                draining = time.perf_counter()
                self.checkpoints.manager.close()
                if self.metrics:  # the last save's writing, after the last step: not step time
                    self.metrics.write(
                        {
                            "kind": "checkpoint_drain",
                            "ms": 1000 * (time.perf_counter() - draining),
                            "time": time.time(),
                        }
                    )
                    self.metrics.close()
                    self.metrics = None
                if self.lineage:
                    self.lineage.close()
                    self.lineage = None
            finally:
                if self.run_lock:
                    self.run_lock.release()
                    self.run_lock = None

    def _finish(self) -> TrainResult:
        self.close()
        if not self.dist.is_main:
            self.dist.barrier()
            return TrainResult(self.run_dir, self.progress.step, self.progress.tokens, {}, None)
        records = read_metrics(self.run_dir / "metrics.jsonl")
        summary = summarize(records)
        if self.cfg.report:
            plot_run(
                records, self.run_dir / "loss.png", f"{self.cfg.run} on {self.inputs.binding.commit[:12]}"
            )
            table = summary_table(summary)
            (self.run_dir / "summary.md").write_text(table)
            print(table, flush=True)
        self.dist.barrier()
        saved = list_checkpoints(self.checkpoint_dir)
        return TrainResult(
            self.run_dir,
            self.progress.step,
            self.progress.tokens,
            summary,
            str(saved[-1].path) if saved else None,
        )


def train(config: TrainConfig) -> TrainResult:
    """Run (or resume) training as configured; under ``torchrun`` this is one rank of the job."""
    dist = init_distributed(config.device)
    try:
        if dist.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        with deterministic_kernels(config.deterministic):
            trainer = Trainer(config, dist)
            try:
                return trainer.run()
            finally:
                trainer.close()
    finally:
        close_distributed()
