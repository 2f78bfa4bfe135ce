"""The model as it trains: initialised from the seed, parallelised (DDP or FSDP2) and compiled,
with its optimizer, LR schedule, autocast and gradient scaler, and the micro-batch that fits."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from training.config import TrainConfig
from training.distributed import DistContext
from training.membudget import choose_micro_batch
from training.metrics import peak_flops
from training.model import GPT
from training.runstate import WarmupCosine, autocast_dtype, seed_everything


class ModelEngine:
    """``raw_model`` is the module whose state dicts are checkpointed; ``model`` is what runs the
    forward pass (the same module, compiled or wrapped in DDP)."""

    def __init__(
        self,
        config: TrainConfig,
        dist: DistContext,
        vocab_size: int,
        seq_len: int,
        say: Callable[[str], None],
    ):
        self.cfg, self.dist, self.device, self.say = config, dist, dist.device, say
        seed_everything(config.seed)  # the model's initialisation draws from the RNG seeded here
        gpt_config = config.model.gpt_config(vocab_size, seq_len, config.perf.loss_chunk_tokens)
        self.raw_model = GPT(gpt_config).to(self.device)
        self.dtype = autocast_dtype(config.dtype, self.device)
        self.autocast = (
            torch.autocast(self.device.type, dtype=self.dtype)
            if self.dtype != torch.float32
            else nullcontext()
        )
        self.micro_batch = self._choose_micro_batch(vocab_size, seq_len)
        self.accumulation = config.global_batch // (self.micro_batch * dist.world_size)
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
        self.flops_per_token = self.raw_model.flops_per_token(seq_len)
        self.peak = peak_flops(self.device, config.peak_flops)

    def stages_live_state(self) -> bool:
        """Whether checkpoints stage the live tensors into host buffers (unsharded, asynchronous
        saves) or take the fresh CPU copies ``get_state_dict`` makes (FSDP gathers; sync saves)."""
        return self.cfg.checkpoint.async_save and not self.sharded

    def gradient_sync(self, enabled: bool) -> None:
        """All-reduce gradients on the last micro-step only (as nanoGPT does)."""
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = enabled
        elif hasattr(self.raw_model, "set_requires_gradient_sync"):  # FSDP2
            self.raw_model.set_requires_gradient_sync(enabled)

    def unwrap(self) -> None:
        """Drop the DDP wrapper (see ``Trainer.close``: it must go before the process group)."""
        self.ddp = None
        self.model = self.raw_model

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

    def _parallelize(self, model: GPT) -> torch.nn.Module:
        """FSDP2 shards ``model`` in place (blocks, then the root); DDP and compile wrap it."""
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
