"""Typed, validated trainer configuration (pydantic, frozen): defaults a newcomer can run on a CPU.

One :class:`TrainConfig` describes a run completely; it is written to the run directory,
stored in every checkpoint, and travels to ``torchrun`` workers as JSON.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.model import GPTConfig

MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64},  # tests and CPU demos
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384},  # a laptop-sized model
    "gpt2-124m": {"n_layer": 12, "n_head": 12, "n_embd": 768},
    "gpt2-350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024},  # GPT-2 medium
    "gpt2-774m": {"n_layer": 36, "n_head": 20, "n_embd": 1280},  # GPT-2 large
}
PresetName = Literal["tiny", "small", "gpt2-124m", "gpt2-350m", "gpt2-774m"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
ResumePolicy = Literal["auto", "never", "allow-data-change"]
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    """Architecture; vocabulary size and sequence length come from the dataset's manifest."""

    n_layer: int = Field(default=2, ge=1)
    n_head: int = Field(default=2, ge=1)
    n_embd: int = Field(default=64, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    bias: bool = False

    @classmethod
    def preset(cls, name: str, **overrides: object) -> ModelConfig:
        if name not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
        return cls(**{**MODEL_PRESETS[name], **overrides})

    def gpt_config(self, vocab_size: int, seq_len: int, loss_chunk_tokens: int = 0) -> GPTConfig:
        # A vocabulary padded to a multiple of 64 keeps the output matmul on fast kernels
        # (nanoGPT's 50257 -> 50304); the extra rows are never targets.
        padded = -(-vocab_size // 64) * 64
        return GPTConfig(
            vocab_size=padded, block_size=seq_len, loss_chunk_tokens=loss_chunk_tokens, **self.model_dump()
        )

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        return self


class OptimConfig(_Frozen):
    """AdamW with linear warmup then cosine decay to ``min_lr``."""

    lr: float = Field(default=1e-3, gt=0)
    min_lr: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=10, ge=0)
    decay_steps: int | None = Field(default=None, ge=1, description="cosine length; default: the run's steps")
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, gt=0, lt=1)
    beta2: float = Field(default=0.95, gt=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    grad_clip: float = Field(default=1.0, ge=0, description="max global gradient norm; 0 turns clipping off")

    @model_validator(mode="after")
    def _min_below_peak(self) -> OptimConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}")
        return self


class DataConfig(_Frozen):
    heldout_fraction: float = Field(
        default=0.01, ge=0, lt=0.5, description="tail of each source kept out of training for evaluation"
    )
    eval_sequences: int = Field(default=64, ge=0, description="held-out sequences per evaluation")
    prefetch_batches: int = Field(default=4, ge=1, description="batches assembled ahead of training")
    cache_dir: str | None = Field(default=None, description="shard cache; default <data home>/cache/shards")
    loader: Literal["process", "thread"] = Field(
        default="process",
        description="process: one loader process per node with a warm shadow that takes over if it fails; "
        "thread: a thread in each trainer process (small runs, tests)",
    )
    cache_max_bytes: int | None = Field(
        default=None, ge=1, description="cap on the node's shard cache; None: no cap (shards still stream)"
    )
    cache_protect_steps: int = Field(
        default=2, ge=0, description="the shards of the next N steps are never evicted from the cache"
    )
    fetch_ahead_steps: int = Field(default=8, ge=1, description="shards are fetched this many steps ahead")
    fetch_workers: int = Field(default=4, ge=1, description="concurrent shard downloads per loader")
    fetch_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="stop when a shard cannot be fetched for this long (repository down)",
    )
    loader_timeout_s: float = Field(
        default=30.0, gt=0, description="a loader process silent this long is replaced by its shadow"
    )
    shadow_prefetch_batches: int = Field(default=2, ge=1, description="batches the shadow loader keeps ready")
    wait_warning_s: float = Field(
        default=5.0, ge=0, description="a step waiting this long for data says why (console and metrics)"
    )


class CheckpointConfig(_Frozen):
    every: int = Field(default=50, ge=1, description="save every N steps (and at the last step)")
    keep_last: int = Field(default=3, ge=1)
    milestone_every: int = Field(
        default=0, ge=0, description="steps whose checkpoint is never deleted; 0: none"
    )
    async_save: bool = Field(default=True, description="write to disk on a background thread")


class PerfConfig(_Frozen):
    """Speed levers, each off or on, measured by ``benchmarks/gpu_train.py``.

    None changes what a step computes beyond floating-point rounding: the chunked loss sums
    the same cross-entropy in another order, and ``sync_every`` only moves the moment the
    host reads the loss (see ``docs/training.md``, "Host synchronisation")."""

    compile_mode: CompileMode = Field(
        default="default", description="torch.compile mode when compile is on (CUDA graphs: reduce-overhead)"
    )
    compile_scope: Literal["model", "blocks"] = Field(
        default="model",
        description="compile the whole model, or each transformer block (one compilation reused by every "
        "block: much shorter compile times, the same kernels inside the blocks)",
    )
    loss_chunk_tokens: int = Field(
        default=0,
        ge=0,
        description="cross-entropy over chunks of this many tokens, gradients computed chunk by chunk, so "
        "the full logits never exist in fp32; 0: the plain loss over the full logits",
    )
    auto_micro_batch: bool = Field(
        default=False,
        description="on CUDA, probe for the largest micro-batch that divides the per-rank batch and fits "
        "in memory with memory_headroom to spare; micro_batch is used elsewhere",
    )
    memory_headroom: float = Field(
        default=0.1, ge=0, lt=1, description="share of device memory the micro-batch probe leaves free"
    )
    fused_optimizer: bool = Field(default=True, description="fused AdamW kernels on CUDA")
    sync_every: int = Field(
        default=1,
        ge=1,
        description="1: read each step's loss and gradient norm before applying it (a host sync per step); "
        "N > 1: apply steps without waiting and judge them in order every N steps and before every "
        "checkpoint, evaluation and the end (same results; a bad step costs up to N-1 wasted steps)",
    )


class StabilityConfig(_Frozen):
    """Roll back to the last good checkpoint on a non-finite loss or gradient, or a loss spike."""

    enabled: bool = True
    window: int = Field(default=50, ge=2, description="trailing losses the z-score is computed over")
    zscore: float = Field(default=6.0, gt=0)
    min_history: int = Field(default=10, ge=2, description="losses needed before spikes are judged")
    max_rollbacks: int = Field(default=5, ge=0, description="give up (fail) after this many rollbacks")


class FaultConfig(_Frozen):
    """Injected faults for the crash and stability tests; each kill fires once per run
    (a marker file in the run directory remembers it), so a restarted run goes past it."""

    kill_at_steps: tuple[int, ...] = Field(default=(), description="SIGKILL every rank inside step N")
    kill_in_save_at_steps: tuple[int, ...] = Field(default=(), description="SIGKILL during step N's save")
    spike_at_positions: tuple[int, ...] = Field(default=(), description="x1000 loss on batches holding these")
    nan_at_positions: tuple[int, ...] = Field(default=(), description="NaN loss on batches holding these")
    lineage_outage: bool = Field(
        default=False, description="the lineage writer finds the repository unreachable: records stay queued"
    )
    kill_loader_at_batches: tuple[int, ...] = Field(
        default=(),
        description="SIGKILL the active loader process as the N-th batch is handed out (warm shadow)",
    )
    stop_loader_at_batches: tuple[int, ...] = Field(
        default=(), description="SIGSTOP the active loader process (it stops answering) at the N-th batch"
    )


class TrainConfig(_Frozen):
    run: str = Field(description="run name: checkpoints and metrics live in <home>/runs/<run>")
    commit: str = Field(description="data commit id (a ref is resolved once at start, the id is recorded)")
    repo: str | None = Field(
        default=None,
        description="dataset repository spec; default versioning.default_repo_spec() "
        "($TOKENLAKE_REPO, else <data home>/repo), whatever home is",
    )
    home: str | None = Field(
        default=None,
        description="runs and cache root (not the repository's); default $TOKENLAKE_HOME or ./.tokenlake",
    )
    steps: int = Field(default=100, ge=1, description="optimizer steps to reach")
    global_batch: int = Field(default=8, ge=1, description="sequences per optimizer step, over all ranks")
    micro_batch: int = Field(default=4, ge=1, description="sequences per rank per forward/backward")
    seed: int = 1337
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    stability: StabilityConfig = StabilityConfig()
    faults: FaultConfig = FaultConfig()
    perf: PerfConfig = PerfConfig()
    eval_every: int = Field(default=50, ge=0, description="evaluate every N steps (and at the end); 0: never")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="autocast dtype; auto: bfloat16 on CUDA, float32 on CPU"
    )
    compile: bool = False
    parallel: Literal["ddp", "fsdp"] = "ddp"
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="auto: one CUDA device per process when CUDA is available (NCCL), else the CPU (gloo); "
        "cpu: the CPU and gloo even where CUDA is available",
    )
    deterministic: bool = Field(
        default=False,
        description="deterministic kernels (slower on CUDA); CPU kernels already are, for a fixed thread count",
    )
    report: bool = Field(default=True, description="write the summary table and the loss plot at the end")
    tensorboard: bool = Field(
        default=False,
        description="rank 0 also writes TensorBoard event files beside metrics.jsonl (needs the tensorboard "
        "package: pip install tensorboard); off: tensorboard is never imported",
    )
    resume: ResumePolicy = "auto"
    allow_reverted: bool = Field(
        default=False,
        description="train on a data commit that a rollback of main reverted (refused otherwise); "
        "the choice is recorded in the run's lineage",
    )
    flow_run_id: str = ""
    log_samples: bool = Field(default=False, description="write the sample ids each rank trains on (tests)")
    peak_flops: float | None = Field(
        default=None, gt=0, description="per-device peak for MFU; default by GPU"
    )
    progress: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not _RUN_NAME.match(self.run):
            raise ValueError(f"run name {self.run!r} must be letters, digits, '.', '_' or '-' (at most 100)")
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} must be a multiple of micro_batch {self.micro_batch}"
            )
        return self

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each rank; the global batch is the same on any world size."""
        per_step = self.micro_batch * world_size
        if self.global_batch % per_step:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch} "
                f"x {world_size} processes; choose a global batch divisible by both"
            )
        return self.global_batch // per_step

    def home_dir(self) -> Path:
        if self.home:
            return Path(self.home).resolve()
        from versioning import data_home

        return data_home()

    def run_dir(self) -> Path:
        return self.home_dir() / "runs" / self.run

    def cache_dir(self) -> Path:
        return (
            Path(self.data.cache_dir).resolve()
            if self.data.cache_dir
            else self.home_dir() / "cache" / "shards"
        )
