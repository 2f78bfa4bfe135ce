"""Content-addressed object files: ``objects/ab/cdef...`` named by the digest of the bytes.

The digest is the repository's **object hash**, recorded once in its database: ``sha256``
for repositories created before format 2, ``blake3`` for new ones (2.7x faster here, see
``docs/versioning.md``). An object's id never changes: a repository keeps the hash it was
created with.

A write goes to a temp file under ``objects/tmp``, hashed while it is copied, then renamed
to ``objects/pending/<digest>``: complete, so a reader sees the object or nothing, and safe
against a killed process, but not yet fsynced. A commit makes the objects it references
durable at once (:meth:`ObjectStore.make_durable`): one ``syncfs`` for their data, a rename
of each to its content address, one ``syncfs`` for the renames, before the commit row is
written. So a committed tree only ever names durable objects, and an object reaches its
content address (where later writes of the same bytes find it and stop) only once durable.
A crash leaves at most orphan temp files, swept when the repository is next ensured, and
pending objects, which a later commit moves or a sweep removes.

Speed: a file is copied by the kernel (``copy_file_range``, no user-space copy) while a
worker thread hashes each chunk *of the temp file* just written (hashlib and blake3
release the GIL), so the digest always describes the stored bytes even if the source
changes under us. Other streams go through two alternating buffers: one is hashed while
the other is written and refilled.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import io
import mmap
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Protocol

import blake3

from versioning.diskspace import DiskFull, disk_full_message, is_disk_full
from versioning.liveness import pid_alive
from versioning.port import InvalidPath, NotFound, PutSource

CHUNK_BYTES = 8 << 20
SMALL_BYTES = 1 << 20  # below this, one read and an inline hash beat any threading
_MAX_QUEUED_HASHES = 8
_KERNEL_COPY_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF}

ReadInto = Callable[[memoryview], int | None]


class _Digest(Protocol):
    def update(self, data: bytes | memoryview | mmap.mmap, /) -> object: ...

    def hexdigest(self) -> str: ...


OBJECT_HASHES: dict[str, Callable[[], _Digest]] = {"sha256": hashlib.sha256, "blake3": blake3.blake3}
NEW_REPOSITORY_HASH = "blake3"  # format 2; a repository without a recorded hash is format 1, sha256


def digest_of(algorithm: str, data: bytes) -> str:
    """The object id of ``data`` in a repository whose object hash is ``algorithm``."""
    digest = OBJECT_HASHES[algorithm]()
    digest.update(data)
    return digest.hexdigest()


class _KernelCopyUnsupported(Exception):
    """copy_file_range cannot copy between these two files; stream through user space."""


class ObjectStore:
    def __init__(self, root: Path, durable: bool = True, algorithm: str = "sha256"):
        self.dir = root / "objects"
        self.temp_dir = self.dir / "tmp"
        self.pending_dir = self.dir / "pending"
        self.durable = durable
        self.algorithm = algorithm
        self._new_digest = OBJECT_HASHES[algorithm]
        self._dir_text = str(self.dir)

    def create(self) -> None:
        """The store's directories; the 256 fan-out directories appear as objects land."""
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.pending_dir.mkdir(exist_ok=True)
        if self.durable:
            _fsync_dir(self.dir)

    def path(self, sha256: str) -> str:
        return os.path.join(self._dir_text, sha256[:2], sha256[2:])

    def pending_path(self, digest: str) -> str:
        return os.path.join(self._dir_text, "pending", digest)

    def open(self, sha256: str, label: str) -> BinaryIO:
        for path in (self.path(sha256), self.pending_path(sha256), self.path(sha256)):  # a commit may move it
            try:
                return open(path, "rb")  # noqa: SIM115 - the caller closes it
            except FileNotFoundError:
                continue
        raise NotFound(
            f"object file for {label} ({self.algorithm} {sha256}) is missing from the store"
        ) from None

    def make_durable(self, digests: set[str]) -> None:
        """Move the pending objects among ``digests`` to their content address, durably: one
        ``syncfs`` for all their bytes, the renames, one ``syncfs`` for the directory entries."""
        moving = []
        for digest in sorted(digests):
            if os.path.exists(self.path(digest)):
                continue
            if not os.path.exists(self.pending_path(digest)) and not os.path.exists(self.path(digest)):
                raise NotFound(f"staged object {digest} is missing from the store (pending or final)")
            moving.append(digest)
        if not moving:
            return
        if self.durable:
            _sync_filesystem(self.dir, [self.pending_path(d) for d in moving])
        for digest in moving:
            self._rename_into_place(self.pending_path(digest), self.path(digest))
        if self.durable:
            _sync_filesystem(self.dir, [os.path.dirname(self.path(d)) for d in moving])

    def write(self, data: PutSource) -> tuple[str, int]:
        """Store ``data``; returns (sha256 hex, size). Streams files and file objects."""
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            return self._write_buffer(view.cast("B") if view.contiguous else memoryview(bytes(view)))
        if isinstance(data, str | os.PathLike):
            try:
                with open(data, "rb", buffering=0) as source:
                    return self._write_file(source.fileno(), 0, source.readinto, source.seek)
            except FileNotFoundError:
                raise NotFound(f"source file {os.fspath(data)!r} does not exist") from None
            except IsADirectoryError:
                raise InvalidPath(f"source {os.fspath(data)!r} is a directory, not a file") from None
        if isinstance(data, io.TextIOBase):
            raise InvalidPath("put needs bytes, a binary file object or a file path; got a text-mode file")
        if hasattr(data, "readinto") or hasattr(data, "read"):
            readinto = data.readinto if hasattr(data, "readinto") else _readinto_from_read(data)
            start = _regular_file_offset(data)
            if start is None:
                return self._store(lambda fd: _copy_stream_hashing(readinto, fd, self._new_digest()))
            sha256, size = self._write_file(data.fileno(), start, readinto, data.seek)
            data.seek(start + size)  # leave the file object where a full read would
            return sha256, size
        raise InvalidPath(f"put needs bytes, a binary file object or a file path; got {type(data).__name__}")

    def sweep_temp_files(self) -> int:
        """Remove temp files left by writers that no longer run, and pending copies of objects
        that are stored already; returns how many."""
        removed = 0
        if self.pending_dir.is_dir():
            for entry in os.scandir(self.pending_dir):
                if os.path.exists(self.path(entry.name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
        for entry in os.scandir(self.temp_dir):
            pid_text = entry.name.split("-", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid() or pid_alive(int(pid_text)):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
        return removed

    def _write_buffer(self, view: memoryview) -> tuple[str, int]:
        if len(view) < SMALL_BYTES:
            digest = self._new_digest()
            digest.update(view)
            sha256 = digest.hexdigest()
            if os.path.exists(self.path(sha256)):  # these bytes are stored already
                return sha256, len(view)

            def fill(fd: int) -> tuple[str, int]:
                _write_all(fd, view)
                return sha256, len(view)

            return self._store(fill, len(view))

        def fill_hashing(fd: int) -> tuple[str, int]:
            digest = self._new_digest()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenlake-hash") as hasher:
                hashed = hasher.submit(digest.update, view)
                _write_all(fd, view)
                hashed.result()
            return digest.hexdigest(), len(view)

        return self._store(fill_hashing, len(view))

    def _write_file(
        self, source_fd: int, start: int, readinto: ReadInto, seek: Callable[[int], object]
    ) -> tuple[str, int]:
        """A regular file from offset ``start``: kernel copy when possible. ``seek`` is the
        file object's own, so a buffered reader drops its buffer when rewound."""

        def fill(fd: int) -> tuple[str, int]:
            try:
                return _copy_file_hashing(source_fd, start, fd, self._new_digest())
            except _KernelCopyUnsupported:
                seek(start)
                return _copy_stream_hashing(readinto, fd, self._new_digest())

        return self._store(fill, max(0, os.fstat(source_fd).st_size - start))

    def _store(self, fill: Callable[[int], tuple[str, int]], size: int | None = None) -> tuple[str, int]:
        """Run ``fill`` on a fresh temp file, then publish the file under its digest.

        A full disk removes the temp file and raises :class:`DiskFull` naming the store and
        ``size``, the object's size when known."""
        temp = str(self.temp_dir / f"{os.getpid()}-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o444)
        except FileNotFoundError:
            raise NotFound(
                f"object store {self.dir} is missing: create the repository with ensure()"
            ) from None
        try:
            try:
                sha256, size = fill(fd)
            finally:
                os.close(fd)
            if os.path.exists(self.path(sha256)):  # stored and durable already
                os.unlink(temp)
            else:  # durable when a commit takes it (make_durable)
                try:
                    os.rename(temp, self.pending_path(sha256))
                except FileNotFoundError:
                    if not os.path.isdir(self.temp_dir):
                        raise
                    self.pending_dir.mkdir(exist_ok=True)  # a store created before pending/ existed
                    os.rename(temp, self.pending_path(sha256))
        except BaseException as exc:
            written = _size_of(temp)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if is_disk_full(exc):
                where = "an object to the repository's object store"
                raise DiskFull(disk_full_message(where, self.dir, size, written)) from None
            raise
        return sha256, size

    def _rename_into_place(self, pending: str, final: str) -> None:
        try:
            os.rename(pending, final)
        except FileNotFoundError:
            if os.path.exists(final):  # another commit moved it first
                return
            os.makedirs(os.path.dirname(final), exist_ok=True)
            try:
                os.rename(pending, final)
            except FileNotFoundError:
                if not os.path.exists(final):
                    raise


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _regular_file_offset(source: object) -> int | None:
    """The logical position of a file object backed by a regular file, else None."""
    try:
        fileno = source.fileno()  # type: ignore[attr-defined]
        if not stat.S_ISREG(os.fstat(fileno).st_mode) or not source.seekable():  # type: ignore[attr-defined]
            return None
        if source.writable():  # type: ignore[attr-defined]
            source.flush()  # type: ignore[attr-defined]
        return source.tell()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _copy_file_hashing(source_fd: int, start: int, fd: int, digest: _Digest) -> tuple[str, int]:
    head = os.pread(source_fd, SMALL_BYTES, start)
    if len(head) < SMALL_BYTES:
        if os.pread(source_fd, 1, start + len(head)):  # grew meanwhile: take the general path
            raise _KernelCopyUnsupported
        _write_all(fd, memoryview(head))
        digest.update(head)
        return digest.hexdigest(), len(head)
    size = 0
    queued: deque[Future[None]] = deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenlake-hash") as hasher:
        try:
            while n := _kernel_copy(source_fd, fd, start + size, size, CHUNK_BYTES):
                queued.append(hasher.submit(_hash_file_range, digest, fd, size, n))
                size += n
                while len(queued) > _MAX_QUEUED_HASHES:
                    queued.popleft().result()
        finally:
            while queued:
                queued.popleft().result()
    return digest.hexdigest(), size


def _kernel_copy(source_fd: int, fd: int, source_offset: int, offset: int, count: int) -> int:
    """Copy up to ``count`` bytes (fewer only at the end of the source); 0 at the end."""
    if not hasattr(os, "copy_file_range"):
        raise _KernelCopyUnsupported
    copied = 0
    while copied < count:
        try:
            n = os.copy_file_range(source_fd, fd, count - copied, source_offset + copied, offset + copied)
        except OSError as exc:
            if offset + copied == 0 and exc.errno in _KERNEL_COPY_UNSUPPORTED:
                raise _KernelCopyUnsupported from exc
            raise
        if n == 0:
            break
        copied += n
    return copied


def _hash_file_range(digest: _Digest, fd: int, offset: int, length: int) -> None:
    with mmap.mmap(fd, length, offset=offset, access=mmap.ACCESS_READ) as mapped:
        digest.update(mapped)


def _copy_stream_hashing(readinto: ReadInto, fd: int, digest: _Digest) -> tuple[str, int]:
    """Copy a stream into ``fd`` while a worker thread hashes each chunk just read.

    Two buffers alternate: the worker hashes one while this thread writes it and then
    reads the next chunk into the other, so hashing overlaps the IO instead of adding to it.
    """
    first = memoryview(bytearray(SMALL_BYTES))
    n = _fill(readinto, first)
    if n < len(first):  # the whole object fit in one read
        digest.update(first[:n])
        _write_all(fd, first[:n])
        return digest.hexdigest(), n
    buffers = [first, memoryview(bytearray(CHUNK_BYTES))]
    pending: list[Future[None] | None] = [None, None]
    size, slot = 0, 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenlake-hash") as hasher:
        try:
            while n:
                chunk = buffers[slot][:n]
                pending[slot] = hasher.submit(digest.update, chunk)
                _write_all(fd, chunk)
                size += n
                slot ^= 1
                waiting = pending[slot]
                if waiting is not None:
                    waiting.result()
                    pending[slot] = None
                if len(buffers[slot]) < CHUNK_BYTES:
                    buffers[slot] = memoryview(bytearray(CHUNK_BYTES))
                n = _fill(readinto, buffers[slot])
        finally:
            for future in pending:
                if future is not None:
                    future.result()
    return digest.hexdigest(), size


def _fill(readinto: ReadInto, view: memoryview) -> int:
    """Read until ``view`` is full or the stream ends (short reads are not the end)."""
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if n is None:
            raise InvalidPath("put cannot stream from a non-blocking file object that has no data ready")
        if n == 0:
            break
        got += n
    return got


def _readinto_from_read(source: BinaryIO) -> ReadInto:
    def readinto(view: memoryview) -> int:
        data = source.read(len(view))
        if data is None:
            return None  # type: ignore[return-value]
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidPath(f"put's file object returned {type(data).__name__}, not bytes")
        view[: len(data)] = data
        return len(data)

    return readinto


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_syncfs() -> Callable[[int], int] | None:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    try:
        function = ctypes.CDLL(libc_name, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    return function


_syncfs = _load_syncfs()


def _sync_filesystem(directory: Path, paths: list[str]) -> None:
    """Everything written to the filesystem of ``directory`` on disk: Linux's syncfs, one call
    whatever the number of objects; elsewhere an fsync of each of ``paths``."""
    if _syncfs is not None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            if _syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    for path in dict.fromkeys(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
