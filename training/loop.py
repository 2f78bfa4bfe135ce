"""The step loop of one rank.

Each step: take this rank's batch from the prefetching loader, run the micro-steps
(gradients synchronised on the last one only), average the loss over ranks, unscale and
clip the gradients, judge the step (non-finite or spike -> roll back and skip its data),
set the learning rate, step the optimizer. Then metrics, periodic evaluation on held-out
sequences, and periodic checkpoints, each followed by a lineage record.

Judging needs the loss on the host, a synchronisation with the device. With
``perf.sync_every = N > 1`` steps are applied without waiting and judged in order every N
steps and before every checkpoint, evaluation and the end; a bad step rolls back to the
same checkpoint as it would have when judged at once (checkpoints only ever hold judged
steps), so losses, weights and rollbacks are the same, and up to N-1 steps after a bad one
are computed in vain.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from formats.layout import event_record_path
from training.config import TrainConfig
from training.data import Batch, describe_samples
from training.distributed import DistContext
from training.engine import ModelEngine
from training.errors import TrainingError
from training.faults import FaultInjector
from training.inputs import TrainInputs
from training.lineage import LineageWriter
from training.metrics import MetricsLog, peak_memory_mb
from training.resume import RunCheckpoints
from training.stability import Rollback, SpikeDetector
from training.train_state import TrainProgress


@dataclass
class _Step:
    """One step between its backward pass and its judgement; loss and norm still on the device."""

    number: int  # the step it completes (1-based)
    batch: Batch
    loss: torch.Tensor
    grad_norm: torch.Tensor
    data_wait: float
    lr: float = 0.0
    tokens: int = 0  # tokens seen once it is applied
    values: tuple[float, float] = field(default=(math.nan, math.nan))  # (loss, grad norm) on the host


class StepLoop:
    def __init__(
        self,
        config: TrainConfig,
        dist: DistContext,
        engine: ModelEngine,
        inputs: TrainInputs,
        progress: TrainProgress,
        detector: SpikeDetector,
        checkpoints: RunCheckpoints,
        faults: FaultInjector,
        lineage: LineageWriter | None,
        samples_log: IO[str] | None,
        say: Callable[[str], None],
    ):
        self.cfg, self.dist, self.engine, self.inputs = config, dist, engine, inputs
        self.loader, self.dataset = inputs.loader, inputs.dataset
        self.progress, self.detector, self.checkpoints, self.faults = progress, detector, checkpoints, faults
        self.lineage, self.samples_log, self.say = lineage, samples_log, say
        self.metrics: MetricsLog | None = None

    def run(self, metrics: MetricsLog | None) -> None:
        """Train until ``steps``; ``metrics`` (rank 0) gets a record of every accepted step."""
        self.metrics = metrics
        self.steps_in_process = 0
        self._clock = (time.perf_counter(), time.process_time())
        sync_every = self.cfg.perf.sync_every
        unjudged: list[_Step] = []  # applied, loss not read yet (sync_every > 1)
        while self.progress.step < self.cfg.steps:
            step = self._train_step(self.loader.next_batch())
            if sync_every == 1:  # judge before applying: one host sync per step
                if self._judge([step]):
                    self._apply(step)
                    self._complete([step])
                continue
            self._apply(step)
            unjudged.append(step)
            if len(unjudged) >= sync_every or self._judgement_due():
                steps, unjudged = unjudged, []
                if self._judge(steps):
                    self._complete(steps)

    def _train_step(self, batch: Batch) -> _Step:
        """Forward and backward of every micro-step, then unscale and clip. Nothing here waits
        for the device: the loss (averaged over ranks) and the gradient norm stay tensors."""
        engine = self.engine
        factor = self.faults.loss_factor(batch.positions)
        data_wait = self.loader.wait_seconds
        loss_sum = torch.zeros((), device=engine.device)
        tokens = batch.tokens.to(engine.device, non_blocking=True)
        for micro_step in range(engine.accumulation):
            x, y = tokens[micro_step, :, :-1], tokens[micro_step, :, 1:]
            engine.gradient_sync(micro_step == engine.accumulation - 1)
            with engine.autocast:
                _, loss = engine.model(x, y)
                if factor is not None:
                    loss = loss * factor
                loss = loss / engine.accumulation
            engine.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        self.faults.kill_point("step", self.progress.step + 1)
        mean_loss = self.dist.mean(loss_sum)
        engine.scaler.unscale_(engine.optimizer)
        max_norm = self.cfg.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(engine.raw_model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        if engine.scaler.is_enabled():  # float16: inf gradients are the loss scaler's to handle
            grad_norm = torch.zeros_like(mean_loss)
        return _Step(self.progress.step + 1, batch, mean_loss, grad_norm.float(), data_wait)

    def _apply(self, step: _Step) -> None:
        engine = self.engine
        step.lr = engine.schedule.lr(self.progress.step)
        for group in engine.optimizer.param_groups:
            group["lr"] = step.lr
        engine.scaler.step(engine.optimizer)
        engine.scaler.update()
        engine.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        self.progress.tokens += self.cfg.global_batch * self.dataset.seq_len
        step.tokens = self.progress.tokens

    def _judge(self, steps: list[_Step]) -> bool:
        """Read the steps' losses and norms (one host sync for all) and judge them in order. A bad
        one is rolled back (the good ones before it are recorded first); False then."""
        values = torch.stack([torch.stack((s.loss, s.grad_norm)) for s in steps]).tolist()
        for i, (step, (loss, grad_norm)) in enumerate(zip(steps, values, strict=True)):
            step.values = (loss, grad_norm)
            verdict = self.detector.judge(loss, grad_norm) if self.cfg.stability.enabled else None
            if verdict is not None and not verdict.ok:
                self._record(steps[:i])
                self.engine.optimizer.zero_grad(set_to_none=True)
                self._rollback(step, verdict.reason, loss)
                self._clock = (time.perf_counter(), time.process_time())
                return False
            self.detector.accept(loss)
            if self.samples_log:
                self.samples_log.write(
                    json.dumps({"step": step.number, **describe_samples(self.dataset, step.batch)}) + "\n"
                )
                self.samples_log.flush()
        return True

    def _rollback(self, bad: _Step, reason: str, loss: float) -> None:
        """Go back to the newest checkpoint before ``bad`` and skip its samples from then on."""
        batch = bad.batch
        if len(self.progress.rollbacks) >= self.cfg.stability.max_rollbacks:
            raise TrainingError(
                f"step {bad.number} is bad ({reason}) after {len(self.progress.rollbacks)} rollbacks, the most "
                "allowed (stability.max_rollbacks): the run diverges; lower the learning rate or check the data"
            )
        if self.dist.is_main:
            self.checkpoints.manager.wait()
        self.dist.barrier()
        info = self.checkpoints.find(max_step=bad.number - 1)
        if info is None:
            raise TrainingError(
                f"step {bad.number} is bad ({reason}) and no valid checkpoint is left to roll back to"
            )
        event = Rollback(bad.number, info.step, batch.start, batch.end, reason, loss).to_dict()
        rollbacks, skipped = [*self.progress.rollbacks, event], self.loader.skipped
        self.checkpoints.load(info)
        self.progress.rollbacks = rollbacks
        for start, end in [*skipped, (batch.start, batch.end)]:
            self.loader.skip(start, end)
        # Re-save the step we went back to, now carrying the skip: a crash before the next
        # periodic save still resumes with the same choice, even if the fault does not recur.
        self.checkpoints.save()
        self.say(f"rolled back to step {info.step}: {reason}; skipping samples [{batch.start}, {batch.end})")
        if self.metrics:
            self.metrics.write({"kind": "rollback", **event, "time": time.time()})
        if self.lineage:
            self.lineage.record(
                event_record_path(self.cfg.run, "rollback", event["at_step"]), {**event, "run": self.cfg.run}
            )

    def _judgement_due(self) -> bool:
        """Whether the step just applied ends a window (checkpoint, evaluation, the last step)."""
        step = self.progress.step
        evaluates = self.cfg.eval_every and len(self.inputs.evaluation) and step % self.cfg.eval_every == 0
        return step % self.cfg.checkpoint.every == 0 or step == self.cfg.steps or bool(evaluates)

    def _complete(self, steps: list[_Step]) -> None:
        """After judged steps: evaluation and checkpoint when due, then their metrics records.

        The evaluation's time is in the step's wall time (``step_ms``, ``tokens_per_s``) and
        shown on its own as ``eval_ms``, like a checkpoint's stall."""
        extra: dict[str, Any] = {}
        step, last = self.progress.step, self.progress.step == self.cfg.steps
        evaluation = self.inputs.evaluation
        if self.cfg.eval_every and len(evaluation) and (step % self.cfg.eval_every == 0 or last):
            result = evaluation.run(self.engine, self.dist)
            self.checkpoints.last_metrics.update(eval_loss=result.loss, eval_loss_by_source=result.by_source)
            extra["eval_ms"] = 1000 * result.seconds
            if self.metrics:
                self.metrics.write(result.record(step))
        if step % self.cfg.checkpoint.every == 0 or last:
            self.checkpoints.last_metrics.update(loss=steps[-1].values[0], step=step)
            timing = self.checkpoints.save()
            extra.update(
                ckpt_stall_ms=1000 * timing.stall_s,
                ckpt_wait_ms=1000 * timing.waited_s,
                ckpt_staged_mb=timing.staged_bytes / 2**20,
            )
        self._record(steps, extra)

    def _record(self, steps: list[_Step], extra: dict[str, Any] | None = None) -> None:
        """Metrics records of accepted steps; the time since the last record is shared among them."""
        now, cpu_now = time.perf_counter(), time.process_time()
        (last_end, last_cpu), self._clock = self._clock, (now, cpu_now)
        if not steps:
            return
        step_seconds, cpu_seconds = (now - last_end) / len(steps), (cpu_now - last_cpu) / len(steps)
        global_tokens = self.cfg.global_batch * self.dataset.seq_len
        flops = self.engine.flops_per_token * global_tokens / step_seconds
        peak = self.engine.peak
        for step in steps:
            self.steps_in_process += 1
            record: dict[str, Any] = {
                "kind": "train",
                "step": step.number,
                "loss": step.values[0],
                "lr": step.lr,
                "grad_norm": step.values[1],
                "tokens": step.tokens,
                "steps_in_process": self.steps_in_process,
                **(extra if step is steps[-1] and extra else {}),
                "step_ms": 1000 * step_seconds,
                "cpu_ms": 1000 * cpu_seconds,
                "data_wait_ms": 1000 * step.data_wait,
                "data_wait_share": step.data_wait / step_seconds,
                "tokens_per_s": global_tokens / step_seconds,
                "flops_per_s": flops,
                "mfu": flops / (peak * self.dist.world_size) if peak else None,
                "peak_memory_mb": peak_memory_mb(self.engine.device),
                "time": time.time(),
            }
            if self.metrics:
                self.metrics.write(record)
