"""The training loop: one process of a (possibly single-process) DDP or FSDP2 job.

Each step: take this rank's batch from the prefetching loader, run the micro-steps
(gradients synchronised on the last one only), average the loss over ranks, unscale and
clip the gradients, judge the step (non-finite or spike -> roll back and skip its data),
set the learning rate, step the optimizer. Then metrics, periodic evaluation on held-out
sequences, and periodic checkpoints, each followed by a lineage record.

Exactness: model init, data order, RNG states, optimizer and schedule all resume from the
checkpoint, and CPU runs use deterministic kernels, so a run killed at any moment and
restarted produces the same losses and weights, bit for bit, as one that never stopped.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from training.checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    list_checkpoints,
    load_payload,
    newest_valid,
    remove_partial_saves,
)
from training.config import TrainConfig
from training.data import Loader, ShardCache, describe_samples, open_dataset
from training.distributed import DistContext, close_distributed, init_distributed
from training.errors import TrainingError
from training.faults import FaultInjector
from training.lineage import LineageWriter, checkpoint_record_path, event_record_path
from training.metrics import (
    MetricsLog,
    open_jsonl_for_append,
    peak_flops,
    peak_memory_mb,
    plot_run,
    read_metrics,
    summarize,
    summary_table,
)
from training.model import GPT
from training.runlock import RunBusy, RunLock
from training.runstate import (
    WarmupCosine,
    autocast_dtype,
    code_version,
    deterministic_kernels,
    rng_state,
    seed_everything,
    set_rng_state,
)
from training.stability import Rollback, SpikeDetector
from versioning import open_repo

_FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)
_PAYLOAD = ("model.pt", "optim.pt", "state.pt")


class DataChangeRefused(TrainingError):
    """The newest checkpoint was trained on another data commit and the policy does not allow it."""


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
        self.device = dist.device
        self.run_dir = config.run_dir()
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.accumulation = config.accumulation_steps(dist.world_size)
        self.run_lock = self._lock_run()
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(config.model_dump_json(indent=2) + "\n")

        # data: bind to the commit, fill and verify the shard cache (one process per machine)
        repo_spec = config.repo or os.environ.get("TOKENLAKE_REPO") or str(config.home_dir() / "repo")
        repo = open_repo(repo_spec, create=False)
        commit = dist.broadcast(repo.resolve(config.commit) if dist.is_main else None)
        self.binding, self.dataset = open_dataset(
            repo,
            repo_spec,
            commit,
            ShardCache(config.cache_dir(), warn=self.say),
            config.data.heldout_fraction,
            fetch=dist.local_rank == 0,
            barrier=dist.barrier,
        )
        manifest = self.dataset.manifest

        # model, optimizer and their companions
        seed_everything(config.seed)
        self.raw_model = GPT(config.model.gpt_config(manifest.vocab_size, manifest.seq_len)).to(self.device)
        self.ddp: DistributedDataParallel | None = None
        self.model = self._parallelize(self.raw_model)
        self.optimizer = torch.optim.AdamW(
            self.raw_model.optimizer_groups(config.optim.weight_decay),
            lr=config.optim.lr,
            betas=(config.optim.beta1, config.optim.beta2),
            eps=config.optim.eps,
            fused=self.device.type == "cuda",
        )
        self.schedule = WarmupCosine(config.optim, config.steps)
        self.dtype = autocast_dtype(config.dtype, self.device)
        self.autocast = (
            torch.autocast(self.device.type, dtype=self.dtype)
            if self.dtype != torch.float32
            else nullcontext()
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.loader = Loader(
            self.dataset,
            config.global_batch,
            config.micro_batch,
            dist.rank,
            dist.world_size,
            config.data.prefetch_batches,
            pin_memory=self.device.type == "cuda",
        )
        stability = config.stability
        self.detector = SpikeDetector(stability.window, stability.zscore, stability.min_history)
        # whole global batches of held-out sequences, so every world size evaluates the same ones
        self.eval_ids = self.dataset.heldout_ids(
            config.data.eval_sequences // config.global_batch * config.global_batch
        )
        if config.eval_every and len(self.eval_ids[0]) < config.global_batch:
            self.say("evaluation is off: fewer held-out sequences than one global batch")
            self.eval_ids = (self.eval_ids[0][:0], self.eval_ids[1][:0])

        # run state
        self.step = 0
        self.tokens = 0
        self.rollbacks: list[dict] = []
        self.data_changes: list[dict] = []
        self.last_metrics: dict[str, Any] = {}
        self.code_version = code_version()
        self.flops_per_token = self.raw_model.flops_per_token(manifest.seq_len)
        self.peak = peak_flops(self.device, config.peak_flops)
        self.lineage = (
            LineageWriter(
                lambda: open_repo(repo_spec, create=False),
                config.run,
                self.run_dir / "lineage-queue",
                warn=self.say,
            ).start()
            if dist.is_main
            else None
        )
        self.checkpoints = CheckpointManager(
            self.checkpoint_dir,
            config.checkpoint.keep_last,
            config.checkpoint.milestone_every,
            config.checkpoint.async_save,
            on_saved=self._record_checkpoint if dist.is_main else None,
        )
        self.faults = FaultInjector(
            config.faults, self.run_dir, dist.gather(os.getpid()), dist.is_main, settle=self.checkpoints.wait
        )
        self.metrics: MetricsLog | None = None
        self.samples_log = (
            open_jsonl_for_append(self.run_dir / f"samples-rank{dist.rank}-of-{dist.world_size}.jsonl")
            if config.log_samples
            else None
        )

    # ---- setup helpers -------------------------------------------------------------------

    def say(self, message: str) -> None:
        if self.dist.is_main:
            print(f"[train {self.cfg.run}] {message}", flush=True)

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

    def _parallelize(self, model: GPT) -> torch.nn.Module:
        """FSDP2 shards ``model`` in place (blocks, then the root); DDP and compile wrap it.
        ``raw_model`` stays the module whose state dicts are checkpointed."""
        if self.cfg.parallel == "fsdp" and self.dist.active:
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return torch.compile(model) if self.cfg.compile else model
        compiled = torch.compile(model) if self.cfg.compile else model
        if self.dist.active and self.dist.world_size > 1:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(compiled, device_ids=device_ids)
            return self.ddp
        return compiled

    def _gradient_sync(self, enabled: bool) -> None:
        """All-reduce gradients on the last micro-step only (as nanoGPT does)."""
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = enabled
        elif hasattr(self.raw_model, "set_requires_gradient_sync"):  # FSDP2
            self.raw_model.set_requires_gradient_sync(enabled)

    # ---- checkpoints ---------------------------------------------------------------------

    def _state_for_checkpoint(self) -> tuple[dict, dict]:
        model_state, optim_state = get_state_dict(self.raw_model, self.optimizer, options=_FULL_STATE)
        rng = self.dist.gather(rng_state(self.device))
        tensors = {
            "model.pt": model_state,
            "optim.pt": optim_state,
            "state.pt": {
                "schedule": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict(),
                "detector": self.detector.state_dict(),
                "rng": rng,
            },
        }
        meta = {
            "step": self.step,
            "tokens": self.tokens,
            "run": self.cfg.run,
            "world_size": self.dist.world_size,
            "loader": self.loader.state_dict(),
            "rollbacks": self.rollbacks,
            "data_changes": self.data_changes,
            "data": self.binding.to_dict(),
            "config": self.cfg.model_dump(mode="json"),
            "code_version": self.code_version,
            "flow_run_id": self.cfg.flow_run_id,
            "metrics": self.last_metrics,
            "saved_at": time.time(),
        }
        return tensors, meta

    def save_checkpoint(self) -> float:
        """Checkpoint the current step; returns rank 0's stall in seconds."""
        tensors, meta = self._state_for_checkpoint()
        if not self.dist.is_main:
            return 0.0
        step = self.step
        return self.checkpoints.save(
            step,
            tensors,
            meta,
            before_complete=lambda: self.faults.kill_point("save", step),
            copied=self.device.type == "cuda",  # offloading from the GPU made fresh CPU copies
        )

    def _record_checkpoint(self, info: CheckpointInfo) -> None:
        record = {k: v for k, v in info.meta.items() if k != "config"}
        record["checkpoint"] = str(info.path)
        # enough of the config for `tokenlake lineage --step` to replay the sample order
        # without this machine's checkpoint files
        record["sample_order"] = {
            "global_batch": self.cfg.global_batch,
            "heldout_fraction": self.cfg.data.heldout_fraction,
        }
        self.lineage.record(checkpoint_record_path(self.cfg.run, info.step), record)

    def _find_checkpoint(self, max_step: int | None = None) -> CheckpointInfo | None:
        """Rank 0 verifies; every rank gets its answer (checkpoints sit on a shared filesystem)."""
        found = None
        if self.dist.is_main:
            remove_partial_saves(self.checkpoint_dir)
            found = newest_valid(self.checkpoint_dir, max_step, warn=self.say)
        return self.dist.broadcast(found)

    def _load(self, info: CheckpointInfo) -> None:
        payload = load_payload(info, _PAYLOAD)
        set_state_dict(
            self.raw_model,
            self.optimizer,
            model_state_dict=payload["model.pt"],
            optim_state_dict=payload["optim.pt"],
            options=StateDictOptions(full_state_dict=True),
        )
        state = payload["state.pt"]
        self.schedule.load_state_dict(state["schedule"])
        self.scaler.load_state_dict(state["scaler"])
        self.detector.load_state_dict(state["detector"])
        meta = info.meta
        self.step, self.tokens = meta["step"], meta["tokens"]
        self.rollbacks, self.data_changes = list(meta["rollbacks"]), list(meta["data_changes"])
        self.loader.load_state_dict(meta["loader"])
        if len(state["rng"]) == self.dist.world_size:
            set_rng_state(state["rng"][self.dist.rank], self.device)
        else:  # another world size: per-rank streams cannot carry over; derive them from the step
            seed_everything(self.cfg.seed + 1_000_003 * self.step + self.dist.rank)

    def resume(self) -> None:
        """Apply the resume policy: start fresh (writing step 0) or continue from the newest valid checkpoint."""
        info = self._find_checkpoint()
        if info is not None and self.cfg.resume == "never":
            raise TrainingError(
                f"run {self.cfg.run!r} already has checkpoints in {self.checkpoint_dir}; use another run "
                "name, or resume it (--resume auto)"
            )
        if info is None:
            self.say(f"starting fresh on data commit {self.binding.commit[:12]}")
            self.save_checkpoint()  # step 0: the rollback target before the first periodic save
            return
        changed = self.binding.differences(info.meta["data"])
        if changed and self.cfg.resume != "allow-data-change":
            raise DataChangeRefused(
                f"checkpoint {info.path.name} of run {self.cfg.run!r} was trained on data commit "
                f"{info.meta['data']['commit']}, not {self.binding.commit} ({'; '.join(changed)}); "
                "resume with --resume allow-data-change to continue on the new data (it is recorded), "
                "or start a new run"
            )
        self._load(info)
        self.say(f"resumed from {info.path.name} (step {self.step}, {self.tokens} tokens)")
        if self.lineage:
            # A kill between a checkpoint's COMPLETE and the queueing of its lineage record
            # loses the record, and the newest checkpoint is the one that can be affected: queue
            # it again (the same bytes, so the commit is a no-op when it was written).
            self._record_checkpoint(info)
        if changed:
            event = {
                "step": self.step,
                "from": info.meta["data"],
                "to": self.binding.to_dict(),
                "allowed_by": "resume=allow-data-change",
            }
            self.data_changes.append(event)
            self.say(f"continuing on other data, as allowed: {'; '.join(changed)}")
            if self.lineage:
                self.lineage.record(
                    event_record_path(self.cfg.run, "data-change", self.step), {**event, "run": self.cfg.run}
                )

    # ---- the loop ------------------------------------------------------------------------

    def _rollback(self, batch, reason: str, loss: float) -> None:
        if len(self.rollbacks) >= self.cfg.stability.max_rollbacks:
            raise TrainingError(
                f"step {self.step + 1} is bad ({reason}) after {len(self.rollbacks)} rollbacks, the most "
                "allowed (stability.max_rollbacks): the run diverges; lower the learning rate or check the data"
            )
        if self.dist.is_main:
            self.checkpoints.wait()
        self.dist.barrier()
        info = self._find_checkpoint(max_step=self.step)
        if info is None:
            raise TrainingError(
                f"step {self.step + 1} is bad ({reason}) and no valid checkpoint is left to roll back to"
            )
        event = Rollback(self.step + 1, info.step, batch.start, batch.end, reason, loss).to_dict()
        rollbacks, skipped = [*self.rollbacks, event], self.loader.skipped
        self._load(info)
        self.rollbacks = rollbacks
        for start, end in [*skipped, (batch.start, batch.end)]:
            self.loader.skip(start, end)
        # Re-save the step we went back to, now carrying the skip: a crash before the next
        # periodic save still resumes with the same choice, even if the fault does not recur.
        self.save_checkpoint()
        self.say(f"rolled back to step {info.step}: {reason}; skipping samples [{batch.start}, {batch.end})")
        if self.metrics:
            self.metrics.write({"kind": "rollback", **event, "time": time.time()})
        if self.lineage:
            self.lineage.record(
                event_record_path(self.cfg.run, "rollback", event["at_step"]), {**event, "run": self.cfg.run}
            )

    def _evaluate(self) -> float:
        sources, indices = self.eval_ids
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        self.model.eval()
        with torch.no_grad():
            for start in range(0, len(sources), self.cfg.global_batch):
                mine = self.loader.my_slice(np.arange(start, start + self.cfg.global_batch))
                rows = torch.from_numpy(self.dataset.rows(sources[mine], indices[mine])).to(self.device)
                for micro in rows.view(self.accumulation, self.cfg.micro_batch, -1):
                    with self.autocast:
                        _, loss = self.model(micro[:, :-1], micro[:, 1:])
                    tokens = micro[:, 1:].numel()
                    totals += torch.tensor(
                        [loss.item() * tokens, tokens], dtype=torch.float64, device=self.device
                    )
        self.model.train()
        totals = self.dist.sum(totals)
        return float(totals[0] / totals[1])

    def _train_step(self, batch) -> tuple[float, float]:
        """Forward and backward of every micro-step; returns (loss averaged over ranks, gradient norm)."""
        factor = self.faults.loss_factor(batch.positions)
        loss_sum = torch.zeros((), device=self.device)
        tokens = batch.tokens.to(self.device, non_blocking=True)
        for micro_step in range(self.accumulation):
            x, y = tokens[micro_step, :, :-1], tokens[micro_step, :, 1:]
            self._gradient_sync(micro_step == self.accumulation - 1)
            with self.autocast:
                _, loss = self.model(x, y)
                if factor is not None:
                    loss = loss * factor
                loss = loss / self.accumulation
            self.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        self.faults.kill_point("step", self.step + 1)
        loss_value = float(self.dist.mean(loss_sum))
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        if self.scaler.is_enabled():  # float16: inf gradients are the loss scaler's to handle
            return loss_value, 0.0
        return loss_value, float(grad_norm)

    def run(self) -> TrainResult:
        self.resume()
        if self.dist.is_main:
            self.metrics = MetricsLog(
                self.run_dir / "metrics.jsonl", self.cfg.steps, self.step, self.cfg.progress
            )
            self.metrics.write(
                {
                    "kind": "resume",
                    "step": self.step,
                    "world_size": self.dist.world_size,
                    "data_commit": self.binding.commit,
                    "time": time.time(),
                }
            )
        global_tokens = self.cfg.global_batch * self.dataset.seq_len
        steps_in_process = 0
        last_end, last_cpu = time.perf_counter(), time.process_time()
        while self.step < self.cfg.steps:
            batch = self.loader.next_batch()
            data_wait = self.loader.wait_seconds
            loss, grad_norm = self._train_step(batch)
            verdict = self.detector.judge(loss, grad_norm) if self.cfg.stability.enabled else None
            if verdict is not None and not verdict.ok:
                self.optimizer.zero_grad(set_to_none=True)
                self._rollback(batch, verdict.reason, loss)
                last_end, last_cpu = time.perf_counter(), time.process_time()
                continue
            lr = self.schedule.lr(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            self.tokens += global_tokens
            self.detector.accept(loss)
            steps_in_process += 1
            if self.samples_log:
                self.samples_log.write(
                    json.dumps({"step": self.step, **describe_samples(self.dataset, batch)}) + "\n"
                )
                self.samples_log.flush()

            record: dict[str, Any] = {
                "kind": "train",
                "step": self.step,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens": self.tokens,
                "steps_in_process": steps_in_process,
            }
            if (
                self.cfg.eval_every
                and len(self.eval_ids[0])
                and (self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps)
            ):
                eval_loss = self._evaluate()
                self.last_metrics["eval_loss"] = eval_loss
                if self.metrics:
                    self.metrics.write(
                        {"kind": "eval", "step": self.step, "eval_loss": eval_loss, "time": time.time()}
                    )
            if self.step % self.cfg.checkpoint.every == 0 or self.step == self.cfg.steps:
                self.last_metrics.update(loss=loss, step=self.step)
                record["ckpt_stall_ms"] = 1000 * self.save_checkpoint()
            now = time.perf_counter()
            step_seconds, last_end = now - last_end, now
            cpu_now = time.process_time()
            cpu_seconds, last_cpu = cpu_now - last_cpu, cpu_now
            flops = self.flops_per_token * global_tokens / step_seconds
            record.update(
                step_ms=1000 * step_seconds,
                cpu_ms=1000 * cpu_seconds,
                data_wait_ms=1000 * data_wait,
                data_wait_share=data_wait / step_seconds,
                tokens_per_s=global_tokens / step_seconds,
                flops_per_s=flops,
                mfu=flops / (self.peak * self.dist.world_size) if self.peak else None,
                peak_memory_mb=peak_memory_mb(self.device),
                time=time.time(),
            )
            if self.metrics:
                self.metrics.write(record)
        return self._finish()

    def close(self) -> None:
        """Stop the loader, finish a save in flight, give queued lineage a last try (also after an error).

        The DDP wrapper goes first, while the process group is still registered: its C++
        reducer holds the group, and if the reducer were the group's last owner, the group's
        destructor would run under the GIL and wait for a gloo worker thread that needs the
        GIL to free a finished collective's tensors (a hang at exit, found by the chaos
        campaign). Freed here, the group is destroyed later by ``destroy_process_group``,
        whose binding lets go of the GIL first."""
        self.ddp = None
        self.model = self.raw_model
        self.loader.close()
        if self.samples_log:
            self.samples_log.close()
            self.samples_log = None
        if self.dist.is_main:
            try:
                self.checkpoints.wait()
                if self.metrics:
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
            return TrainResult(self.run_dir, self.step, self.tokens, {}, None)
        records = read_metrics(self.run_dir / "metrics.jsonl")
        summary = summarize(records)
        if self.cfg.report:
            plot_run(records, self.run_dir / "loss.png", f"{self.cfg.run} on {self.binding.commit[:12]}")
            table = summary_table(summary)
            (self.run_dir / "summary.md").write_text(table)
            print(table, flush=True)
        self.dist.barrier()
        saved = list_checkpoints(self.checkpoint_dir)
        return TrainResult(
            self.run_dir, self.step, self.tokens, summary, str(saved[-1].path) if saved else None
        )


def train(config: TrainConfig) -> TrainResult:
    """Run (or resume) training as configured; under ``torchrun`` this is one rank of the job."""
    dist = init_distributed()
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
