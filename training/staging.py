"""Host staging for asynchronous checkpoints: snapshot the state into reused host buffers.

A save must capture the state of the step it is taken at while training goes on changing the
parameters and the optimizer state. :class:`HostStaging` copies every tensor storage of a
state tree into host buffers that it allocates on the first save and reuses afterwards (a
checkpoint of the same model has the same storages every time):

* the buffers are slices of one anonymous memory mapping (the arena), each its own storage
  of exactly its source's size, so ``torch.save`` writes exactly what it would for the source;
* on CUDA the arena is page-locked once with ``cudaHostRegister`` (PyTorch's caching pinned
  allocator would round every buffer up to a power of two, up to twice the memory, and
  registering buffers one by one fails where two small ones share a page), and the copies
  are issued with ``non_blocking=True`` on a dedicated stream that first waits for the
  compute stream. An event recorded after the copies is
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
import mmap
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

_ALIGN = 64  # bytes between buffers in the arena: every dtype's alignment, and a cache line


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


class _Arena:
    """One anonymous mapping, page-aligned, cut into buffers; page-locked as a whole on CUDA."""

    def __init__(self, layout: tuple[tuple[tuple, int], ...], pinned: bool):
        self.layout = layout
        self.views: dict[tuple, torch.Tensor] = {}  # staged tensors over the buffers, by path and shape
        self.source_bytes: dict[tuple, torch.Tensor] = {}  # the last save's sources as flat bytes
        offsets, total = [], 0
        for _, size in layout:
            offsets.append(total)
            total += -(-size // _ALIGN) * _ALIGN
        self.nbytes = total
        self.memory = mmap.mmap(-1, max(total, 1))
        view = memoryview(self.memory)
        self.buffers = {
            slot: torch.frombuffer(view[offset : offset + size], dtype=torch.uint8)
            if size
            else torch.empty(0, dtype=torch.uint8)
            for (slot, size), offset in zip(layout, offsets, strict=True)
        }
        if pinned and total:
            cudart = torch.cuda.cudart()
            pointer = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
            status = int(cudart.cudaHostRegister(pointer, total, 0))
            if status != 0:
                raise RuntimeError(
                    f"cudaHostRegister of {total} bytes of checkpoint buffers failed (cudaError {status})"
                )
            # Unlocked when the arena goes; at interpreter exit the CUDA runtime may be gone already.
            self._unregister: Callable | None = weakref.finalize(self, cudart.cudaHostUnregister, pointer)


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """The whole storage as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


class HostStaging:
    """Copies state trees into host buffers it owns; one arena, reused while the state's layout holds."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._arena: _Arena | None = None
        self._stream: torch.cuda.Stream | None = None
        self._unfenced: torch.cuda.Event | None = None

    def buffer_pointers(self) -> dict[tuple, int]:
        """Where each buffer lives: the same addresses save after save once the state's shape is stable."""
        return {slot: b.data_ptr() for slot, b in self._arena.buffers.items()} if self._arena else {}

    def buffers_pinned(self) -> bool:
        """Whether every (non-empty) buffer is page-locked memory the GPU can copy into asynchronously."""
        return self._arena is not None and all(
            b.is_pinned() for b in self._arena.buffers.values() if b.numel()
        )

    def stage(self, tree: Any) -> StagedState:
        """Start copying ``tree`` into the buffers; returns at once on CUDA (the copy runs on a side stream)."""
        # pass 1: the distinct source storages, each under the path of its first tensor (its slot)
        key_of: dict[tuple, tuple] = {}  # a tensor's path -> its storage's key
        sources: dict[tuple, tuple[tuple, torch.Tensor]] = {}  # storage key -> (slot, first tensor)
        for path, tensor in _tensors(tree, ()):
            key = key_of[path] = _storage_key(tensor, path)
            if key not in sources:
                sources[key] = (path, tensor)
        layout = tuple((slot, tensor.untyped_storage().nbytes()) for slot, tensor in sources.values())
        if self._arena is None or self._arena.layout != layout:
            self._arena = None  # unlock and unmap the old arena before mapping a new one
            self._arena = _Arena(layout, self.pinned)
        arena = self._arena

        # pass 2: the same tree, every tensor a view of its storage's buffer. The views, and the
        # byte views of the sources, stay with the arena: the next save of the same state reuses them.
        def stage_tensor(tensor: torch.Tensor, path: tuple) -> torch.Tensor:
            shape = (
                path,
                tensor.dtype,
                tensor.storage_offset(),
                tensor.size(),
                tensor.stride(),
                tensor.requires_grad,
            )
            staged = arena.views.get(shape)
            if staged is None:
                slot = sources[key_of[path]][0]
                staged = torch.empty(0, dtype=tensor.dtype).set_(
                    arena.buffers[slot].untyped_storage(),
                    tensor.storage_offset(),
                    tensor.size(),
                    tensor.stride(),
                )
                arena.views[shape] = staged.requires_grad_(tensor.requires_grad)
            return staged

        staged_tree = _rebuild(tree, (), stage_tensor, {})
        source_bytes = {}
        for key, (_, tensor) in sources.items():
            cached = arena.source_bytes.get(key)
            source_bytes[key] = (
                cached if cached is not None else _bytes_of(tensor.untyped_storage(), tensor.device)
            )
        arena.source_bytes = source_bytes  # only this save's: a storage no longer staged is let go
        copies = [(source_bytes[key], arena.buffers[slot]) for key, (slot, _) in sources.items()]
        nbytes = sum(size for _, size in layout)
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

    def release(self) -> None:
        """Give the buffers back (unlocked and unmapped) and drop the stream; the next stage starts afresh."""
        self._arena = None
        self._stream = None
        self._unfenced = None

    def fence(self) -> None:
        """Make the compute stream wait (on the GPU, not the host) for copies still reading the state.

        Call it before anything changes the staged tensors in place: the optimizer step."""
        if self._unfenced is not None:
            torch.cuda.current_stream(self.device).wait_event(self._unfenced)
            self._unfenced = None


def _storage_key(tensor: torch.Tensor, path: tuple) -> tuple:
    """Tensors sharing a storage share a key (an empty storage is never shared)."""
    if type(tensor) is not torch.Tensor:
        raise TypeError(
            f"checkpoint staging takes plain tensors; {'/'.join(map(str, path))} is a "
            f"{type(tensor).__name__} (gather it to a full tensor first)"
        )
    storage = tensor.untyped_storage()
    size = storage.nbytes()
    return (str(tensor.device), storage.data_ptr(), size) if size else ("empty", path)


def _tensors(obj: Any, path: tuple):
    """(path, tensor) of every tensor in a state tree, in the order ``_rebuild`` meets them."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _tensors(value, (*path, key))
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _tensors(value, (*path, i))


def _rebuild(
    obj: Any, path: tuple, on_tensor: Callable[[torch.Tensor, tuple], Any], memo: dict[int, Any]
) -> Any:
    """``obj`` with every tensor replaced by ``on_tensor(tensor, path)``; containers keep their types
    (an OrderedDict its attributes), a container met twice stays one object, other leaves are copied."""
    if isinstance(obj, torch.Tensor):
        return on_tensor(obj, path)
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, dict):
        rebuilt = memo[id(obj)] = copy.copy(obj)
        for key, value in obj.items():
            rebuilt[key] = _rebuild(value, (*path, key), on_tensor, memo)
        return rebuilt
    if isinstance(obj, list):
        rebuilt = memo[id(obj)] = []
        rebuilt.extend(_rebuild(value, (*path, i), on_tensor, memo) for i, value in enumerate(obj))
        return rebuilt
    if isinstance(obj, tuple):
        rebuilt = memo[id(obj)] = type(obj)(
            _rebuild(v, (*path, i), on_tensor, memo) for i, v in enumerate(obj)
        )
        return rebuilt
    return copy.deepcopy(obj)
