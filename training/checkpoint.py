"""Checkpoints on disk: written atomically, verified on load, pruned to keep-last-k + milestones.

Layout of one checkpoint, ``<run>/checkpoints/step-NNNNNNN/``:

* ``model.pt``, ``optim.pt``, ``state.pt``: plain (full, unsharded) state dicts written with
  ``torch.save``; everything in them loads with ``torch.load(weights_only=True)``.
* ``meta.json``: step, tokens, loader position, skipped windows, rollbacks, the data
  binding, the config, the code version, metrics (human-readable; lineage copies it).
* ``COMPLETE``: written last: the sha256 and size of every other file.

Everything is written into ``.tmp-step-NNNNNNN-<pid>/`` and renamed into place, so a
directory named ``step-*`` always holds a complete checkpoint; a crash mid-save leaves
only a ``.tmp-*`` directory, removed at the next start. Loading re-hashes every file and
refuses a checkpoint whose digests, sizes or ``COMPLETE`` do not match.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from formats.digest import file_sha256
from training.errors import TrainingError
from training.staging import HostStaging, StagedState
from versioning.diskspace import disk_full_message, is_disk_full

FORMAT_VERSION = 1
COMPLETE = "COMPLETE"
META = "meta.json"
_STEP_DIR = re.compile(r"^step-(\d{7,})$")


class CheckpointError(TrainingError):
    """A checkpoint that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    meta: dict[str, Any]


def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


class _HashingWriter:
    """A file wrapper that hashes what passes through it, so nothing is read back to hash it."""

    def __init__(self, file):
        self.file = file
        self.digest = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None  # torch.save reports a failed write as a bare RuntimeError

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()


def _write_file(path: Path, write: Callable[[_HashingWriter], None]) -> dict[str, Any]:
    with path.open("wb") as f:
        writer = _HashingWriter(f)
        try:
            write(writer)
        except Exception:
            if writer.error is not None:
                raise writer.error from None  # the OSError itself (a full disk, say), not torch's wrapper
            raise
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": writer.digest.hexdigest(), "bytes": writer.size}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    directory: Path,
    step: int,
    tensors: dict[str, Any],
    meta: dict[str, Any],
    before_complete: Callable[[], None] | None = None,
) -> Path:
    """Write ``tensors`` (file name -> object for ``torch.save``) and ``meta`` as one checkpoint.

    ``before_complete`` runs after the payload is on disk and before ``COMPLETE`` (the crash
    tests kill the process there). An existing checkpoint of the same step is replaced.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / step_dir_name(step)
    tmp = directory / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        return _write_into(directory, final, tmp, step, tensors, meta, before_complete)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays, trusted or not
        raise CheckpointError(
            disk_full_message(f"checkpoint step {step} to", directory, payload_bytes(tensors))
        ) from None


def payload_bytes(tensors: dict[str, Any]) -> int:
    """The bytes of every tensor in ``tensors``: about what a checkpoint of them takes on disk."""
    if isinstance(tensors, torch.Tensor):
        return tensors.untyped_storage().nbytes()
    if isinstance(tensors, dict):
        return sum(payload_bytes(v) for v in tensors.values())
    if isinstance(tensors, list | tuple):
        return sum(payload_bytes(v) for v in tensors)
    return 0


def _write_into(
    directory: Path,
    final: Path,
    tmp: Path,
    step: int,
    tensors: dict[str, Any],
    meta: dict[str, Any],
    before_complete: Callable[[], None] | None,
) -> Path:
    tmp.mkdir()
    # One thread per payload file: hashing and writing release the GIL, so the optimizer state
    # (the largest file) no longer waits for the model's to finish.
    with ThreadPoolExecutor(max_workers=max(1, len(tensors)), thread_name_prefix="ckpt-file") as pool:
        pending = {
            name: pool.submit(_write_file, tmp / name, lambda w, obj=obj: torch.save(obj, w))
            for name, obj in tensors.items()
        }
        files = {name: future.result() for name, future in pending.items()}
    meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    files[META] = _write_file(tmp / META, lambda w: w.write(meta_bytes))
    if before_complete is not None:
        before_complete()
    complete = {"format": FORMAT_VERSION, "step": step, "files": files}
    _write_file(tmp / COMPLETE, lambda w: w.write(json.dumps(complete, indent=2, sort_keys=True).encode()))
    _fsync_dir(tmp)
    if final.exists():  # a replayed step (after a rollback or a resume) replaces the old one
        trash = directory / f".trash-{final.name}-{os.getpid()}"
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash)
    else:
        os.rename(tmp, final)
    _fsync_dir(directory)
    return final


def verify_checkpoint(path: Path) -> CheckpointInfo:
    """Check ``COMPLETE`` against every file; raise CheckpointError naming the first problem."""
    try:
        complete = json.loads((path / COMPLETE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {COMPLETE} marker (the save did not finish)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: {COMPLETE} is not valid JSON ({exc})") from None
    if complete.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {complete.get('format')} (this code reads {FORMAT_VERSION})"
        )
    for name, expected in complete["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if file.stat().st_size != expected["bytes"]:
            raise CheckpointError(
                f"{path}: {name} is {file.stat().st_size} bytes, {COMPLETE} says {expected['bytes']}"
            )
        if file_sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{path}: {name} does not match its sha256 in {COMPLETE} (corrupted)")
    meta = json.loads((path / META).read_text())
    return CheckpointInfo(path, int(complete["step"]), meta)


def load_payload(info: CheckpointInfo, names: tuple[str, ...]) -> dict[str, Any]:
    """The named files of a verified checkpoint, loaded with ``weights_only=True``."""
    try:
        return {name: torch.load(info.path / name, map_location="cpu", weights_only=True) for name in names}
    except Exception as exc:  # a digest-valid file that still fails to unpickle safely
        raise CheckpointError(f"{info.path}: cannot load safely with weights_only=True: {exc}") from exc


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Checkpoints with a ``COMPLETE`` marker, oldest first, their meta read but files not re-hashed."""
    found = []
    if not directory.is_dir():
        return found
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE).is_file():
            try:
                meta = json.loads((child / META).read_text())
            except (OSError, json.JSONDecodeError):
                continue
            found.append(CheckpointInfo(child, int(match.group(1)), meta))
    return sorted(found, key=lambda c: c.step)


def newest_valid(
    directory: Path, max_step: int | None = None, warn: Callable[[str], None] = print
) -> CheckpointInfo | None:
    """The newest checkpoint (at or before ``max_step``) that verifies; each one skipped is reported."""
    candidates = sorted(
        (int(m.group(1)), child)
        for child in (directory.iterdir() if directory.is_dir() else ())
        if (m := _STEP_DIR.match(child.name))
    )
    for step, path in reversed(candidates):
        if max_step is not None and step > max_step:
            continue
        try:
            return verify_checkpoint(path)
        except (CheckpointError, OSError, json.JSONDecodeError, KeyError) as exc:
            warn(f"skipping checkpoint {path.name}: {exc}")
    return None


def remove_partial_saves(directory: Path) -> list[Path]:
    """Remove ``.tmp-*``/``.trash-*`` leftovers of saves a crash interrupted."""
    removed = []
    if directory.is_dir():
        for child in directory.iterdir():
            if child.name.startswith((".tmp-step-", ".trash-step-")):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


@dataclass(frozen=True)
class SaveTiming:
    """What one save cost the training thread."""

    stall_s: float  # blocked in save() altogether
    waited_s: float  # of which: waiting for the previous save to finish writing (it owned the buffers)
    waited_for_step: int | None  # the step of that previous save, when it was still being written
    staged_bytes: int  # copied into the host buffers (0: written synchronously, or already copied)


class CheckpointManager:
    """Saves (optionally on a background thread), then prunes to keep-last-k plus milestones.

    An asynchronous save stages the state into host buffers (:class:`training.staging.HostStaging`:
    pinned memory and a side stream on CUDA, plain memory on the CPU) and returns; a
    background thread waits for the copy, then serialises, hashes and fsyncs. Those buffers
    belong to one save at a time, so a save first waits for the previous one to be written;
    that wait is part of the stall and is reported on its own (:class:`SaveTiming`), so a
    checkpoint schedule faster than the disk shows up instead of going unnoticed.

    ``on_saved(info)`` runs after each checkpoint is complete (the trainer writes lineage
    there). One save is in flight at most: the next save, a rollback and the end of the
    run first wait for it, and an error of a background save is raised there.
    """

    def __init__(
        self,
        directory: Path,
        keep_last: int,
        milestone_every: int = 0,
        async_save: bool = True,
        on_saved: Callable[[CheckpointInfo], None] | None = None,
        device: torch.device | None = None,
    ):
        self.directory = directory
        self.keep_last = keep_last
        self.milestone_every = milestone_every
        self.async_save = async_save
        self.on_saved = on_saved
        self.staging = HostStaging(device or torch.device("cpu"))
        self._thread: threading.Thread | None = None
        self._thread_step: int | None = None
        self._error: BaseException | None = None

    def is_milestone(self, step: int) -> bool:
        return self.milestone_every > 0 and step % self.milestone_every == 0

    def save(
        self,
        step: int,
        tensors: dict[str, Any],
        meta: dict[str, Any],
        before_complete: Callable[[], None] | None = None,
        copied: bool = False,
    ) -> SaveTiming:
        """Save a checkpoint; returns what it cost the caller (the checkpoint stall).

        ``copied`` says no tensor in ``tensors`` is still used by training (a full state dict
        FSDP already gathered into fresh CPU memory), so an asynchronous save need not stage it."""
        started = time.perf_counter()
        still_writing = self._thread_step if self._thread is not None and self._thread.is_alive() else None
        self.wait()
        waited = time.perf_counter() - started
        meta = copy.deepcopy({**meta, "milestone": self.is_milestone(step)})  # training goes on changing it
        if not self.async_save:
            self._write(step, tensors, meta, before_complete)
            return SaveTiming(time.perf_counter() - started, waited, still_writing, 0)
        staged = StagedState(tensors, 0) if copied else self.staging.stage(tensors)
        self._thread = threading.Thread(
            target=self._write_in_background,
            args=(step, staged, meta, before_complete),
            name=f"checkpoint-{step}",
            daemon=False,  # the interpreter waits for a save in flight before exiting
        )
        self._thread_step = step
        self._thread.start()
        return SaveTiming(time.perf_counter() - started, waited, still_writing, staged.nbytes)

    def fence(self) -> None:
        """Call before the state is changed in place (the optimizer step): on CUDA the compute
        stream then waits for a staging copy still reading it; elsewhere a no-op."""
        self.staging.fence()

    def close(self) -> None:
        """Finish the save in flight, then give the staging buffers back (a run's end)."""
        self.wait()
        self.staging.release()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"a background checkpoint save failed: {error}") from error

    def _write_in_background(self, step: int, staged: StagedState, meta, before_complete) -> None:
        try:
            staged.wait()
            self._write(step, staged.tree, meta, before_complete)
        except BaseException as exc:  # re-raised on the training thread by wait()
            self._error = exc

    def _write(self, step, tensors, meta, before_complete) -> None:
        path = write_checkpoint(self.directory, step, tensors, meta, before_complete)
        self.prune()
        if self.on_saved is not None:
            self.on_saved(CheckpointInfo(path, step, meta))

    def prune(self) -> list[Path]:
        """Delete checkpoints beyond the newest ``keep_last``, except milestones."""
        checkpoints = list_checkpoints(self.directory)
        keep = {c.step for c in checkpoints[-self.keep_last :]}
        removed = []
        for c in checkpoints:
            if c.step not in keep and not c.meta.get("milestone"):
                # renamed first, so a crash half-way through the delete leaves a .trash-* directory
                # (swept at the next start), never a step-* directory with files missing
                trash = self.directory / f".trash-{c.path.name}-{os.getpid()}"
                os.rename(c.path, trash)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(c.path)
        return removed
