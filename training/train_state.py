"""The pieces of training state a checkpoint holds, each a ``Stateful`` (``state_dict`` /
``load_state_dict``), and where each lives in a checkpoint's files.

The trainer declares them once, as ``Trainer.states`` (``training/trainer.py``,
``Trainer._declare_states``): a mapping ``name -> (stateful, Slot)`` that saving and
loading both walk (:meth:`training.checkpoint.CheckpointManager.collect` and ``restore``),
as torchtitan's ``CheckpointManager(states=...)`` does. Adding a piece is one line there.

The files stay those of checkpoint format 1 (``training/checkpoint.py``): ``model.pt`` and
``optim.pt`` hold one piece each, ``state.pt`` several under their names, and ``meta.json``
the run's progress at its top level (step, tokens, rollbacks, data changes) and the loader's
position under ``loader``, next to what describes the checkpoint (run, data binding, config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from training.checkpoint import META
from training.distributed import DistContext
from training.runstate import rng_state, seed_everything, set_rng_state

# full (unsharded) state dicts: under FSDP2 every rank takes part, rank 0 writes them
_FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)
_LOAD_FULL_STATE = StateDictOptions(full_state_dict=True)  # also the live tensors, without copies


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass(frozen=True)
class Slot:
    """Where a piece's state lives in a checkpoint: a file and, in a file shared by several
    pieces, its key there. ``key=None``: the file is the piece's own (``model.pt``), or, in
    ``meta.json``, the piece's keys sit at the top level."""

    file: str
    key: str | None = None


States = Mapping[str, tuple[Stateful, Slot]]


def collect_states(states: States) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every piece's ``state_dict`` placed in its file: ``(tensor files, meta.json fields)``.

    Called on every rank, in the same order (model, optimizer and RNG states are collectives)."""
    files: dict[str, dict[str, Any]] = {}
    for piece, slot in states.values():
        state = piece.state_dict()
        content = files.setdefault(slot.file, {})
        if slot.key is None:
            content.update(state)
        else:
            content[slot.key] = state
    meta = files.pop(META, {})
    return files, meta


def tensor_files(states: States) -> tuple[str, ...]:
    """The ``torch.save`` files the pieces live in (every file but ``meta.json``)."""
    return tuple(dict.fromkeys(slot.file for _, slot in states.values() if slot.file != META))


def restore_states(states: States, files: Mapping[str, Any]) -> None:
    """Load every piece from its file, in declaration order (``files`` includes ``meta.json``)."""
    for piece, slot in states.values():
        content = files[slot.file]
        piece.load_state_dict(content if slot.key is None else content[slot.key])


@dataclass
class TrainProgress:
    """How far the run is: optimizer steps, tokens, and the events that changed its course."""

    step: int = 0
    tokens: int = 0
    rollbacks: list[dict] = field(default_factory=list)  # diverging steps rolled back and skipped
    data_changes: list[dict] = field(default_factory=list)  # resumes allowed onto other data

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens": self.tokens,
            "rollbacks": list(self.rollbacks),
            "data_changes": list(self.data_changes),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.rollbacks, self.data_changes = list(state["rollbacks"]), list(state["data_changes"])


class ModelState:
    """The model's full state dict (FSDP2-sharded or not).

    ``live``: the model's own tensors instead of fresh CPU copies, for an unsharded model whose
    checkpoints are staged into host buffers (``training/staging.py``); for such a model that
    is what ``get_model_state_dict`` returns, as a plain dict, without its per-call cost."""

    def __init__(self, model: torch.nn.Module, live: bool = False):
        self.model = model
        self.live = live

    def state_dict(self) -> dict[str, Any]:
        if self.live:
            return dict(self.model.state_dict())
        return get_model_state_dict(self.model, options=_FULL_STATE)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state, options=_LOAD_FULL_STATE)


class OptimizerState:
    """The optimizer's full state dict, keyed by the model's parameter names.

    ``live``: the optimizer's own tensors, for an unsharded model whose checkpoints are staged
    into host buffers. ``get_optimizer_state_dict`` works out every parameter's name and checks
    its options on each call: tens of milliseconds of Python for GPT-2 124M, on the training
    thread at every checkpoint while the GPU waits. The names are fixed for the optimizer's
    life, so here they are worked out once, and the result is what ``get_optimizer_state_dict``
    returns for an unsharded model: the same tensors, pickled to the same bytes (tested)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, live: bool = False):
        self.model = model
        self.optimizer = optimizer
        self.live = live
        name_of = {id(p): name for name, p in model.named_parameters()}  # a tied parameter once
        self.names = [name_of.get(id(p)) for group in optimizer.param_groups for p in group["params"]]

    def state_dict(self) -> dict[str, Any]:
        if not self.live:
            return get_optimizer_state_dict(self.model, self.optimizer, options=_FULL_STATE)
        if not self.optimizer.state:
            # the first call creates the optimizer's state (a step with zero gradients and a zero
            # learning rate): going through it keeps a run's numbers the same either way
            return get_optimizer_state_dict(self.model, self.optimizer, options=_LOAD_FULL_STATE)
        packed = self.optimizer.state_dict()
        return _unshared(
            {
                "state": {self.names[index]: state for index, state in packed["state"].items()},
                "param_groups": [
                    {**group, "params": [self.names[index] for index in group["params"]]}
                    for group in packed["param_groups"]
                ],
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state, options=_LOAD_FULL_STATE)


class RNGState:
    """Every rank's random streams (python, numpy, torch, cuda), gathered on save.

    Loaded on the same world size, each rank takes its own streams back; on another world size
    per-rank streams cannot carry over, so each rank's are derived from the seed and the step
    (``progress`` must be loaded first)."""

    def __init__(self, dist: DistContext, device: torch.device, seed: int, progress: TrainProgress):
        self.dist = dist
        self.device = device
        self.seed = seed
        self.progress = progress

    def state_dict(self) -> list[dict]:
        return self.dist.gather(rng_state(self.device))

    def load_state_dict(self, states: list[dict]) -> None:
        if len(states) == self.dist.world_size:
            set_rng_state(states[self.dist.rank], self.device)
        else:
            seed_everything(self.seed + 1_000_003 * self.progress.step + self.dist.rank)


def _unshared(obj: Any) -> Any:
    """Every container rebuilt, none shared (``Optimizer.state_dict`` shares the groups' ``betas``),
    as ``get_optimizer_state_dict`` returns them, so that both pickle to the same bytes."""
    if isinstance(obj, dict):
        return {key: _unshared(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_unshared(value) for value in obj)
    return obj
