"""Content-addressed object files: ``objects/ab/cdef...`` named by the sha256 of the bytes.

A write streams its source in large chunks into a temp file under ``objects/tmp``
while a second thread hashes the same chunk (hashlib releases the GIL), fsyncs it,
then renames it to its content address. A reader therefore sees a complete object
or none; a crash leaves at most an orphan temp file, swept when the repository is
next ensured by a process that outlives the writer.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import io
import os
import secrets
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from versioning.port import InvalidPath, NotFound, PutSource

CHUNK_BYTES = 8 << 20
FIRST_READ_BYTES = 256 << 10  # small objects never allocate the large buffers
_TEMP_SUFFIX = ".tmp"

ReadInto = Callable[[memoryview], int | None]


class ObjectStore:
    def __init__(self, root: Path, durable: bool = True):
        self.dir = root / "objects"
        self.temp_dir = self.dir / "tmp"
        self.durable = durable

    def create(self) -> None:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        for i in range(256):
            (self.dir / f"{i:02x}").mkdir(exist_ok=True)
        if self.durable:
            _fsync_dir(self.dir)

    def path(self, sha256: str) -> Path:
        return self.dir / sha256[:2] / sha256[2:]

    def open(self, sha256: str, label: str) -> BinaryIO:
        try:
            return open(self.path(sha256), "rb")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            raise NotFound(f"object file for {label} (sha256 {sha256}) is missing from the store") from None

    def write(self, data: PutSource) -> tuple[str, int]:
        """Store ``data``; returns (sha256 hex, size). Streams files and file objects."""
        if isinstance(data, bytes | bytearray | memoryview):
            return self._write_buffer(
                memoryview(data).cast("B") if memoryview(data).contiguous else bytes(data)
            )
        if isinstance(data, str | os.PathLike):
            try:
                with open(data, "rb", buffering=0) as source:
                    return self._write_stream(source.readinto)
            except FileNotFoundError:
                raise NotFound(f"source file {os.fspath(data)!r} does not exist") from None
            except IsADirectoryError:
                raise InvalidPath(f"source {os.fspath(data)!r} is a directory, not a file") from None
        if isinstance(data, io.TextIOBase):
            raise InvalidPath("put needs bytes, a binary file object or a file path; got a text-mode file")
        if hasattr(data, "readinto"):
            return self._write_stream(data.readinto)
        if hasattr(data, "read"):
            return self._write_stream(_readinto_from_read(data))
        raise InvalidPath(f"put needs bytes, a binary file object or a file path; got {type(data).__name__}")

    def sweep_temp_files(self) -> int:
        """Remove temp files left by writers that no longer run; returns how many."""
        removed = 0
        for entry in os.scandir(self.temp_dir):
            pid_text = entry.name.split("-", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid() or _process_alive(int(pid_text)):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
        return removed

    def _write_buffer(self, view: memoryview | bytes) -> tuple[str, int]:
        sha256 = hashlib.sha256(view).hexdigest()
        if not self.path(sha256).exists():  # same bytes already stored: nothing to write
            fd, temp = self._temp_file()
            try:
                _write_all(fd, memoryview(view))
                self._finish(fd, temp, sha256)
            except BaseException:
                _discard(fd, temp)
                raise
        return sha256, len(view)

    def _write_stream(self, readinto: ReadInto) -> tuple[str, int]:
        fd, temp = self._temp_file()
        try:
            sha256, size = _copy_hashing(readinto, fd, start_writeback=self.durable)
            self._finish(fd, temp, sha256)
        except BaseException:
            _discard(fd, temp)
            raise
        return sha256, size

    def _temp_file(self) -> tuple[int, str]:
        temp = str(self.temp_dir / f"{os.getpid()}-{secrets.token_hex(8)}{_TEMP_SUFFIX}")
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444), temp
        except FileNotFoundError:
            raise NotFound(
                f"object store {self.dir} is missing: create the repository with ensure()"
            ) from None

    def _finish(self, fd: int, temp: str, sha256: str) -> None:
        """Make the temp file durable, then give it its content address atomically."""
        if self.durable:
            os.fdatasync(fd)
        os.close(fd)
        final = self.path(sha256)
        if final.exists():
            os.unlink(temp)
            return
        os.rename(temp, final)
        if self.durable:
            _fsync_dir(final.parent)


def _copy_hashing(readinto: ReadInto, fd: int, start_writeback: bool) -> tuple[str, int]:
    """Copy a stream into ``fd`` while a worker thread hashes each chunk just written.

    Two buffers alternate: the worker hashes one while this thread writes it and then
    reads the next chunk into the other, so hashing overlaps the IO instead of adding to it.
    """
    digest = hashlib.sha256()
    first = memoryview(bytearray(FIRST_READ_BYTES))
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
                if start_writeback:
                    _start_writeback(fd, size, n)
                size += n
                slot ^= 1
                if pending[slot] is not None:
                    pending[slot].result()  # type: ignore[union-attr]
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


def _discard(fd: int, temp: str) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(temp)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """Linux's sync_file_range(WRITE): start writeback of a chunk without waiting, so the
    final fdatasync finds most pages already on their way to disk."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not hasattr(os, "fdatasync"):
        return None
    try:
        function = ctypes.CDLL(libc_name, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    sync_file_range_write = 2

    def start(fd: int, offset: int, length: int) -> None:
        function(fd, offset, length, sync_file_range_write)  # advisory: a failure only loses speed

    return start


_sync_file_range = _load_sync_file_range()


def _start_writeback(fd: int, offset: int, length: int) -> None:
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length)
