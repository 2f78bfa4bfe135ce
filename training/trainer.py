"""The training loop: one process of a (possibly single-process) DDP or FSDP2 job.

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

Exactness: model init, data order, RNG states, optimizer and schedule all resume from the
checkpoint, and CPU runs use deterministic kernels, so a run killed at any moment and
restarted produces the same losses and weights, bit for bit, as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from formats.layout import checkpoint_record_path, event_record_path
from training.checkpoint import (
    META,
    CheckpointInfo,
    CheckpointManager,
    SaveTiming,
    list_checkpoints,
    load_payload,
    newest_valid,
    remove_partial_saves,
)
from training.config import TrainConfig
from training.data import Batch, ShardCache, describe_samples, open_streaming
from training.distributed import DistContext, close_distributed, elastic_restart_count, init_distributed
from training.errors import TrainingError
from training.faults import FaultInjector
from training.lineage import LineageWriter
from training.loader_pool import make_loader
from training.membudget import choose_micro_batch
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
from training.reverted import Reverted, RevertedDataRefused, check_training_data
from training.runlock import RunBusy, RunLock
from training.runstate import (
    WarmupCosine,
    autocast_dtype,
    code_version,
    deterministic_kernels,
    seed_everything,
)
from training.stability import Rollback, SpikeDetector
from training.train_state import (
    ModelState,
    OptimizerState,
    RNGState,
    Slot,
    States,
    TrainProgress,
    collect_states,
    restore_states,
    tensor_files,
)
from versioning import DataRepo, TransientError, default_repo_spec, open_repo


class DataChangeRefused(TrainingError):
    """The newest checkpoint was trained on another data commit and the policy does not allow it."""


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
        self.repo_spec = config.repo or default_repo_spec()
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
        # the order matters: the model's initialisation draws from the RNG seeded here
        try:
            self._build_data()
            self._build_model()
            self._build_loader()
            self._build_evaluation()
            self._build_checkpointing()
        except (
            BaseException
        ):  # loader processes, fetch threads and the run lock must not outlive a failed start
            self._close_failed_start()
            raise
        self.metrics: MetricsLog | None = None
        self.samples_log = (
            open_jsonl_for_append(self.run_dir / f"samples-rank{dist.rank}-of-{dist.world_size}.jsonl")
            if config.log_samples
            else None
        )

    def _close_failed_start(self) -> None:
        if hasattr(self, "loader"):
            self.loader.close()
        if hasattr(self, "data"):
            self.data.stream.close()
        if self.run_lock:
            self.run_lock.release()
            self.run_lock = None

    # ---- builders ------------------------------------------------------------------------

    def _build_data(self) -> None:
        """Bind to the data commit, refused when a rollback reverted it (unless allowed); its shards
        stream into the node's bounded cache as batches need them."""
        repo = open_repo(self.repo_spec, create=False)
        checked = self._check_data_commit(repo) if self.dist.is_main else None
        commit, self.reverted, refusal = self.dist.broadcast(checked)
        if refusal:  # every rank stops with the same sentence
            raise RevertedDataRefused(refusal)
        data = self.cfg.data
        self.cache = ShardCache(
            self.cfg.cache_dir(),
            warn=self.say,
            max_bytes=data.cache_max_bytes,
            protect_steps=data.cache_protect_steps,
        )
        self.data = open_streaming(
            repo,
            self.repo_spec,
            commit,
            self.cache,
            data.heldout_fraction,
            lambda: open_repo(self.repo_spec, create=False),
            workers=data.fetch_workers if data.loader == "thread" else 1,  # else only evaluation reads here
            fetch_timeout_s=data.fetch_timeout_s,
            warn=self.say,
        )
        self.binding, self.dataset = self.data.binding, self.data.dataset

    def _check_data_commit(self, repo: DataRepo) -> tuple[str, Reverted | None, str]:
        """Rank 0: the data commit id, the verdict on it when training on it is allowed, or the refusal.

        Here, not only in the train flow: a direct ``python -m training`` and every resume (a
        retry, a torchrun restart) are checked against the rollbacks recorded by then."""
        commit = repo.resolve(self.cfg.commit)
        try:
            return commit, check_training_data(repo, commit, self.cfg.allow_reverted), ""
        except RevertedDataRefused as refused:
            return commit, None, str(refused)

    def _build_model(self) -> None:
        """The model (parallelised), its optimizer, LR schedule, autocast and gradient scaler."""
        config, manifest = self.cfg, self.dataset.manifest
        seed_everything(config.seed)
        gpt_config = config.model.gpt_config(
            manifest.vocab_size, manifest.seq_len, config.perf.loss_chunk_tokens
        )
        self.raw_model = GPT(gpt_config).to(self.device)
        self.dtype = autocast_dtype(config.dtype, self.device)
        self.autocast = (
            torch.autocast(self.device.type, dtype=self.dtype)
            if self.dtype != torch.float32
            else nullcontext()
        )
        self.micro_batch = self._choose_micro_batch(manifest.vocab_size, manifest.seq_len)
        self.accumulation = config.global_batch // (self.micro_batch * self.dist.world_size)
        self.ddp: DistributedDataParallel | None = None
        self.sharded = False
        self.model = self._parallelize(self.raw_model)
        self.optimizer = torch.optim.AdamW(
            self.raw_model.optimizer_groups(config.optim.weight_decay),
            lr=config.optim.lr,
            betas=(config.optim.beta1, config.optim.beta2),
            eps=config.optim.eps,
            fused=self.device.type == "cuda" and config.perf.fused_optimizer,
        )
        self.schedule = WarmupCosine(config.optim, config.steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.flops_per_token = self.raw_model.flops_per_token(manifest.seq_len)
        self.peak = peak_flops(self.device, config.peak_flops)

    def _build_loader(self) -> None:
        """This rank's batches, and the spike detector that judges each step."""
        config = self.cfg
        self.loader = make_loader(
            config,
            self.dist,
            self.dataset,
            self.data.stream,
            self.data.files,
            self.binding.commit,
            self.repo_spec,
            self.micro_batch,
            notify=self._data_event,
            warn=self.say,
        )
        stability = config.stability
        self.detector = SpikeDetector(stability.window, stability.zscore, stability.min_history)

    def _build_evaluation(self) -> None:
        """Whole global batches of held-out sequences, so every world size evaluates the same ones."""
        config = self.cfg
        self.eval_ids = self.dataset.heldout_ids(
            config.data.eval_sequences // config.global_batch * config.global_batch
        )
        if config.eval_every and len(self.eval_ids[0]) < config.global_batch:
            self.say("evaluation is off: fewer held-out sequences than one global batch")
            self.eval_ids = (self.eval_ids[0][:0], self.eval_ids[1][:0])
        self.dataset.keep_rows(*self.eval_ids)  # read once: evaluating never waits on the cache

    def _build_checkpointing(self) -> None:
        """What a checkpoint holds (``states``), where it goes, and what is recorded about it."""
        config, dist = self.cfg, self.dist
        self.progress = TrainProgress()
        self.last_metrics: dict[str, Any] = {}
        self.code_version = code_version()
        # Every piece of state a checkpoint holds, and where: saving and loading both walk this
        # (training/train_state.py). Loading goes in this order: progress before the RNG.
        self.states: States = {
            "progress": (self.progress, Slot(META)),  # step, tokens, rollbacks, data changes
            "loader": (self.loader, Slot(META, "loader")),  # sample cursor, skipped windows
            "model": (ModelState(self.raw_model, live=self._stages_live_state()), Slot("model.pt")),
            "optimizer": (
                OptimizerState(self.raw_model, self.optimizer, live=self._stages_live_state()),
                Slot("optim.pt"),
            ),
            "schedule": (self.schedule, Slot("state.pt", "schedule")),
            "scaler": (self.scaler, Slot("state.pt", "scaler")),
            "detector": (self.detector, Slot("state.pt", "detector")),
            "rng": (RNGState(dist, self.device, config.seed, self.progress), Slot("state.pt", "rng")),
        }
        self.lineage = (
            LineageWriter(
                self._open_lineage_repo,
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
            device=self.device,
        )
        # A checkpoint being staged reads the parameters and the optimizer state on a side
        # stream; the optimizer step must not change them before that copy is done.
        checkpoints = self.checkpoints
        self.optimizer.register_step_pre_hook(lambda *_: checkpoints.fence())
        self.faults = FaultInjector(
            config.faults, self.run_dir, dist.gather(os.getpid()), dist.is_main, settle=self.checkpoints.wait
        )

    # ---- setup helpers -------------------------------------------------------------------

    def _open_lineage_repo(self) -> DataRepo:
        if self.cfg.faults.lineage_outage:
            raise TransientError("injected fault (faults.lineage_outage): the repository is unreachable")
        return open_repo(self.repo_spec, create=False)

    def _record_reverted_data(self) -> None:
        """Training on data a rollback reverted was allowed: say so, and record it in the run's lineage."""
        if self.reverted is None or not self.dist.is_main:
            return
        self.say(f"training on reverted data, as allowed (allow_reverted): {self.reverted.reason}")
        if self.lineage:
            event = {**self.reverted.to_dict(), "run": self.cfg.run, "step": self.progress.step,
                     "allowed_by": "allow_reverted"}  # fmt: skip
            self.lineage.record(event_record_path(self.cfg.run, "reverted-data", self.progress.step), event)

    def say(self, message: str) -> None:
        if self.dist.is_main:
            print(f"[train {self.cfg.run}] {message}", flush=True)

    def _data_event(self, record: dict[str, Any]) -> None:
        """A loader's report (a step waiting for data, a loader taken over): said, and in the metrics."""
        self.say(record["message"])
        if self.metrics:
            self.metrics.write({**record, "step": self.progress.step + 1, "time": time.time()})

    def _choose_micro_batch(self, vocab_size: int, seq_len: int) -> int:
        """``micro_batch``, or with ``perf.auto_micro_batch`` on CUDA the largest that fits (the
        smallest any rank found, so every rank accumulates the same number of micro-steps)."""
        if not self.cfg.perf.auto_micro_batch:
            return self.cfg.micro_batch
        if self.device.type != "cuda":
            self.say(f"auto micro-batch needs CUDA; using micro_batch {self.cfg.micro_batch}")
            return self.cfg.micro_batch
        choice = choose_micro_batch(
            self.raw_model, self.cfg.global_batch // self.dist.world_size, seq_len, vocab_size, self.device,
            lambda: self.autocast, self.cfg.perf.memory_headroom,
        )  # fmt: skip
        chosen = min(self.dist.gather(choice.micro_batch))
        peak = choice.peak_bytes.get(chosen)
        self.say(
            f"micro-batch {chosen} chosen from memory (probe peak {peak / 2**30:.1f} GiB + optimizer "
            f"{choice.reserved_bytes / 2**30:.1f} GiB within {choice.budget_bytes / 2**30:.1f} GiB)"
            if peak is not None
            else f"micro-batch {chosen} chosen from memory (the smallest any rank could fit)"
        )
        return chosen

    def _compile(self, model: GPT) -> torch.nn.Module:
        perf = self.cfg.perf
        if not self.cfg.compile:
            return model
        if perf.compile_scope == "blocks":  # one compilation, reused by every block; in place
            for block in model.blocks:
                block.compile(mode=perf.compile_mode)
            return model
        return torch.compile(model, mode=perf.compile_mode)

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

            if self.cfg.perf.compile_scope == "blocks":  # compile, then shard (torchtitan's order)
                model = self._compile(model)
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            self.sharded = True
            return model if self.cfg.perf.compile_scope == "blocks" else self._compile(model)
        compiled = self._compile(model)
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

    def _stages_live_state(self) -> bool:
        """Whether checkpoints stage the live tensors into host buffers (unsharded, asynchronous
        saves) or take the fresh CPU copies ``get_state_dict`` makes (FSDP gathers; sync saves)."""
        return self.cfg.checkpoint.async_save and not self.sharded

    def _description(self) -> dict[str, Any]:
        """What ``meta.json`` says about a checkpoint besides its state (never loaded back)."""
        return {
            "run": self.cfg.run,
            "world_size": self.dist.world_size,
            "micro_batch": self.micro_batch,
            "data": self.binding.to_dict(),
            "config": self.cfg.model_dump(mode="json"),
            "code_version": self.code_version,
            "flow_run_id": self.cfg.flow_run_id,
            "metrics": self.last_metrics,
            "saved_at": time.time(),
        }

    def save_checkpoint(self) -> SaveTiming:
        """Checkpoint the current step; returns what it cost rank 0 (zeros on other ranks). The
        stall counts everything the training thread did for it: collecting the state dicts too."""
        started = time.perf_counter()
        tensors, state_meta = collect_states(self.states)  # on every rank: some pieces are collectives
        if not self.dist.is_main:
            return SaveTiming(0.0, 0.0, None, 0)
        step = self.progress.step
        timing = self.checkpoints.save(
            step,
            tensors,
            state_meta | self._description(),
            before_complete=lambda: self.faults.kill_point("save", step),
            copied=not self._stages_live_state(),  # then get_state_dict made fresh CPU copies
        )
        timing = dataclasses.replace(timing, stall_s=time.perf_counter() - started)
        if timing.waited_for_step is not None:
            self.say(
                f"the checkpoint of step {step} waited {1000 * timing.waited_s:.0f} ms for the save of step "
                f"{timing.waited_for_step} to be written: saves take longer than checkpoint.every steps"
            )
        return timing

    def _record_checkpoint(self, info: CheckpointInfo, if_absent: bool = False) -> None:
        record = {k: v for k, v in info.meta.items() if k != "config"}
        record["checkpoint"] = str(info.path)
        # enough of the config for `tokenlake lineage --step` to replay the sample order
        # without this machine's checkpoint files
        record["sample_order"] = {
            "global_batch": self.cfg.global_batch,
            "heldout_fraction": self.cfg.data.heldout_fraction,
        }
        self.lineage.record(checkpoint_record_path(self.cfg.run, info.step), record, if_absent)

    def _find_checkpoint(self, max_step: int | None = None) -> CheckpointInfo | None:
        """Rank 0 verifies; every rank gets its answer (checkpoints sit on a shared filesystem)."""
        found = None
        if self.dist.is_main:
            remove_partial_saves(self.checkpoint_dir)
            found = newest_valid(self.checkpoint_dir, max_step, warn=self.say)
        return self.dist.broadcast(found)

    def _load(self, info: CheckpointInfo) -> None:
        restore_states(self.states, load_payload(info, tensor_files(self.states)) | {META: info.meta})

    def resume(self) -> None:
        """Apply the resume policy: start fresh (writing step 0) or continue from the newest valid checkpoint."""
        info = self._find_checkpoint()
        # "never" refuses an earlier run's checkpoints, not those of this job before torchrun restarted it
        if info is not None and self.cfg.resume == "never" and not elastic_restart_count():
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
        self.say(f"resumed from {info.path.name} (step {self.progress.step}, {self.progress.tokens} tokens)")
        if self.lineage:
            # A kill between a checkpoint's COMPLETE and the queueing of its lineage record
            # loses the record, and the newest checkpoint is the one that can be affected: queue
            # it again, written only if it is missing (a fork's record of it says more).
            self._record_checkpoint(info, if_absent=True)
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

    # ---- the loop ------------------------------------------------------------------------

    def _rollback(self, bad: _Step, reason: str, loss: float) -> None:
        """Go back to the newest checkpoint before ``bad`` and skip its samples from then on."""
        batch = bad.batch
        if len(self.progress.rollbacks) >= self.cfg.stability.max_rollbacks:
            raise TrainingError(
                f"step {bad.number} is bad ({reason}) after {len(self.progress.rollbacks)} rollbacks, the most "
                "allowed (stability.max_rollbacks): the run diverges; lower the learning rate or check the data"
            )
        if self.dist.is_main:
            self.checkpoints.wait()
        self.dist.barrier()
        info = self._find_checkpoint(max_step=bad.number - 1)
        if info is None:
            raise TrainingError(
                f"step {bad.number} is bad ({reason}) and no valid checkpoint is left to roll back to"
            )
        event = Rollback(bad.number, info.step, batch.start, batch.end, reason, loss).to_dict()
        rollbacks, skipped = [*self.progress.rollbacks, event], self.loader.skipped
        self._load(info)
        self.progress.rollbacks = rollbacks
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
                for micro in rows.view(self.accumulation, self.micro_batch, -1):
                    with self.autocast:
                        _, loss = self.model(micro[:, :-1], micro[:, 1:])
                    tokens = micro[:, 1:].numel()
                    totals += torch.tensor(
                        [loss.item() * tokens, tokens], dtype=torch.float64, device=self.device
                    )
        self.model.train()
        totals = self.dist.sum(totals)
        return float(totals[0] / totals[1])

    def _train_step(self, batch: Batch) -> _Step:
        """Forward and backward of every micro-step, then unscale and clip. Nothing here waits
        for the device: the loss (averaged over ranks) and the gradient norm stay tensors."""
        factor = self.faults.loss_factor(batch.positions)
        data_wait = self.loader.wait_seconds
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
        self.faults.kill_point("step", self.progress.step + 1)
        mean_loss = self.dist.mean(loss_sum)
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        if self.scaler.is_enabled():  # float16: inf gradients are the loss scaler's to handle
            grad_norm = torch.zeros_like(mean_loss)
        return _Step(self.progress.step + 1, batch, mean_loss, grad_norm.float(), data_wait)

    def _apply(self, step: _Step) -> None:
        step.lr = self.schedule.lr(self.progress.step)
        for group in self.optimizer.param_groups:
            group["lr"] = step.lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
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
                self.optimizer.zero_grad(set_to_none=True)
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

    def _judgement_due(self) -> bool:
        """Whether the step just applied ends a window (checkpoint, evaluation, the last step)."""
        step = self.progress.step
        evaluates = self.cfg.eval_every and len(self.eval_ids[0]) and step % self.cfg.eval_every == 0
        return step % self.cfg.checkpoint.every == 0 or step == self.cfg.steps or bool(evaluates)

    def _complete(self, steps: list[_Step]) -> None:
        """After judged steps: evaluation and checkpoint when due, then their metrics records."""
        extra: dict[str, Any] = {}
        if (
            self.cfg.eval_every
            and len(self.eval_ids[0])
            and (self.progress.step % self.cfg.eval_every == 0 or self.progress.step == self.cfg.steps)
        ):
            eval_loss = self._evaluate()
            self.last_metrics["eval_loss"] = eval_loss
            if self.metrics:
                self.metrics.write(
                    {"kind": "eval", "step": self.progress.step, "eval_loss": eval_loss, "time": time.time()}
                )
        if self.progress.step % self.cfg.checkpoint.every == 0 or self.progress.step == self.cfg.steps:
            self.last_metrics.update(loss=steps[-1].values[0], step=self.progress.step)
            timing = self.save_checkpoint()
            extra = {
                "ckpt_stall_ms": 1000 * timing.stall_s,
                "ckpt_wait_ms": 1000 * timing.waited_s,
                "ckpt_staged_mb": timing.staged_bytes / 2**20,
            }
        self._record(steps, extra)

    def _record(self, steps: list[_Step], extra: dict[str, Any] | None = None) -> None:
        """Metrics records of accepted steps; the time since the last record is shared among them."""
        now, cpu_now = time.perf_counter(), time.process_time()
        (last_end, last_cpu), self._clock = self._clock, (now, cpu_now)
        if not steps:
            return
        step_seconds, cpu_seconds = (now - last_end) / len(steps), (cpu_now - last_cpu) / len(steps)
        global_tokens = self.cfg.global_batch * self.dataset.seq_len
        flops = self.flops_per_token * global_tokens / step_seconds
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
                "mfu": flops / (self.peak * self.dist.world_size) if self.peak else None,
                "peak_memory_mb": peak_memory_mb(self.device),
                "time": time.time(),
            }
            if self.metrics:
                self.metrics.write(record)

    def run(self) -> TrainResult:
        self.resume()
        self._record_reverted_data()
        if self.dist.is_main:
            self.metrics = MetricsLog(
                self.run_dir / "metrics.jsonl", self.cfg.steps, self.progress.step, self.cfg.progress
            )
            self.metrics.write(
                {
                    "kind": "resume",
                    "step": self.progress.step,
                    "world_size": self.dist.world_size,
                    "micro_batch": self.micro_batch,
                    "data_commit": self.binding.commit,
                    "time": time.time(),
                }
            )
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
        self.data.stream.close()
        if self.metrics:
            self.metrics.write(
                {"kind": "data", **self.loader.report(), "cache": self.cache.stats(), "time": time.time()}
            )
        if self.samples_log:
            self.samples_log.close()
            self.samples_log = None
        if self.dist.is_main:
            try:
                draining = time.perf_counter()
                self.checkpoints.close()
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
            plot_run(records, self.run_dir / "loss.png", f"{self.cfg.run} on {self.binding.commit[:12]}")
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
