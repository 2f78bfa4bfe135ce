"""Host staging for asynchronous checkpoints: snapshot the state into reused host buffers.

A save must capture the state of the step it is taken at while training goes on changing the
parameters and the optimizer state. :class:`HostStaging` copies every tensor storage of a
state tree into host buffers that it allocates on the first save and reuses afterwards (a
checkpoint of the same model has the same storages every time):

* on CUDA the buffers are page-locked, registered with ``cudaHostRegister`` at their exact
  size (PyTorch's caching pinned allocator would round each one up to a power of two, up to
  twice the memory), and the copies are issued with ``non_blocking=True`` on a dedicated
  stream that first waits for the compute stream. An event recorded after the copies is
  what the writer thread waits on before serialising, and what the compute stream waits on
  before the next optimizer step changes what is being copied (:meth:`HostStaging.fence`).
  The training thread only issues the copies;
* on the CPU the buffers are plain memory and the copy is a memcpy on the calling thread.

Storages, not tensors, are staged: entries that share a storage (the tied token embedding
and output head) stay one storage in the staged tree, containers keep their types, and
non-tensor leaves are copied, so ``torch.save`` writes the same bytes for the staged tree as
for the live one: a staged checkpoint is byte-identical to a synchronous one.

The buffers belong to one save at a time; :class:`training.checkpoint.CheckpointManager`
waits for the write in flight before it stages again, and reports that wait.

The design follows torchtitan's ``async_with_pinned_mem`` checkpoint mode (a CPU state dict
allocated once in pinned memory, filled on a side stream, handed to a background writer).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StagedState:
    """A state tree whose tensors are views of host buffers, ready once :meth:`wait` returns."""

    tree: Any
    nbytes: int
    ready: torch.cuda.Event | None = None  # recorded after the copies; None: copied already
    sources: list[torch.Tensor] = field(default_factory=list)  # kept alive until copied

    def wait(self) -> None:
        """Block until the copies are done (the writer thread calls this, not the trainer)."""
        if self.ready is not None:
            self.ready.synchronize()
        self.sources.clear()


def _register_pinned(buffer: torch.Tensor) -> None:
    """Page-lock ``buffer`` in place at its exact size, unlocked again when it is freed."""
    cudart = torch.cuda.cudart()
    pointer, size = buffer.data_ptr(), buffer.numel()
    status = int(cudart.cudaHostRegister(pointer, size, 0))
    if status != 0:
        raise RuntimeError(f"cudaHostRegister of a {size}-byte checkpoint buffer failed (cudaError {status})")
    # At interpreter exit the CUDA runtime may be gone already; an unregister then has nothing to undo.
    weakref.finalize(buffer, cudart.cudaHostUnregister, pointer)


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """The whole storage as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


class HostStaging:
    """Copies state trees into host buffers it owns; one set of buffers, reused across saves."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[tuple, torch.Tensor] = {}  # slot (path of a storage's first tensor) -> buffer
        self._stream: torch.cuda.Stream | None = None
        self._unfenced: torch.cuda.Event | None = None

    def buffer_pointers(self) -> dict[tuple, int]:
        """Where each buffer lives: the same addresses save after save once the state's shape is stable."""
        return {slot: buffer.data_ptr() for slot, buffer in self._buffers.items()}

    def buffers_pinned(self) -> bool:
        """Whether every (non-empty) buffer is page-locked memory the GPU can copy into asynchronously."""
        return all(buffer.is_pinned() for buffer in self._buffers.values() if buffer.numel())

    def stage(self, tree: Any) -> StagedState:
        """Start copying ``tree`` into the buffers; returns at once on CUDA (the copy runs on a side stream)."""
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (source bytes, buffer)
        by_storage: dict[tuple, torch.Tensor] = {}  # a source storage -> its buffer, within this save
        in_use: dict[tuple, torch.Tensor] = {}
        memo: dict[int, Any] = {}  # containers seen twice stay one object, as pickle would write them

        def stage_tensor(tensor: torch.Tensor, path: tuple) -> torch.Tensor:
            if type(tensor) is not torch.Tensor:
                raise TypeError(
                    f"checkpoint staging takes plain tensors; {'/'.join(map(str, path))} is a "
                    f"{type(tensor).__name__} (gather it to a full tensor first)"
                )
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            key = (tensor.device, storage.data_ptr(), size) if size else ("empty", path)
            buffer = by_storage.get(key)
            if buffer is None:
                buffer = self._buffers.get(path)
                if buffer is None or buffer.numel() != size:
                    buffer = self._allocate(size)
                by_storage[key] = in_use[path] = buffer
                copies.append((_bytes_of(storage, tensor.device), buffer))
            staged = torch.empty(0, dtype=tensor.dtype).set_(
                buffer.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride()
            )
            return staged.requires_grad_(tensor.requires_grad)

        def visit(obj: Any, path: tuple) -> Any:
            if isinstance(obj, torch.Tensor):
                return stage_tensor(obj, path)
            if id(obj) in memo:
                return memo[id(obj)]
            if isinstance(obj, dict):
                staged = memo[id(obj)] = copy.copy(obj)  # keeps the type (OrderedDict) and its attributes
                for key, value in obj.items():
                    staged[key] = visit(value, (*path, key))
                return staged
            if isinstance(obj, list):
                staged = memo[id(obj)] = []
                staged.extend(visit(value, (*path, i)) for i, value in enumerate(obj))
                return staged
            if isinstance(obj, tuple):
                staged = type(obj)(visit(value, (*path, i)) for i, value in enumerate(obj))
                memo[id(obj)] = staged
                return staged
            return copy.deepcopy(obj)

        staged_tree = visit(tree, ())
        self._buffers = in_use
        nbytes = sum(buffer.numel() for _, buffer in copies)
        if not self.pinned:
            for source, buffer in copies:
                buffer.copy_(source)
            return StagedState(staged_tree, nbytes)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # copy the state as of now
        with torch.cuda.stream(self._stream):
            for source, buffer in copies:
                buffer.copy_(source, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._unfenced = ready
        return StagedState(staged_tree, nbytes, ready, [source for source, _ in copies])

    def fence(self) -> None:
        """Make the compute stream wait (on the GPU, not the host) for copies still reading the state.

        Call it before anything changes the staged tensors in place: the optimizer step."""
        if self._unfenced is not None:
            torch.cuda.current_stream(self.device).wait_event(self._unfenced)
            self._unfenced = None

    def _allocate(self, size: int) -> torch.Tensor:
        buffer = torch.empty(size, dtype=torch.uint8)
        if self.pinned and size:
            _register_pinned(buffer)
        return buffer
