"""Streaming object bodies in and out of lakeFS without holding a whole object in memory.

Reads are ranged GETs of ``CHUNK`` bytes through the SDK's ObjectReader, so a dropped
connection costs one chunk, not the object, and the stream is seekable (Parquet readers
seek to the footer). Writes go through the SDK's ObjectWriter, which spools to a temporary
file past 32 MiB; a retried upload replays its source from the start.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from lakefs import ObjectReader

from versioning.port import InvalidPath, PutSource

CHUNK = 8 * 1024 * 1024
_SPOOL_IN_MEMORY = 32 * 1024 * 1024

Retry = Callable[[str, Callable[[], bytes]], bytes]


class ObjectStream(io.RawIOBase):
    """A seekable raw stream over one lakeFS object; every ranged read is retried on its own."""

    def __init__(self, reader: ObjectReader, size: int, retry: Retry, action: str):
        super().__init__()
        self._reader = reader
        self._size = size
        self._retry = retry
        self._action = action
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def _read_at(self, position: int, count: int) -> bytes:
        def ranged_read() -> bytes:
            self._reader.seek(position)
            return self._reader.read(count)

        return self._retry(self._action, ranged_read)

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self._size - self._pos)
        if count <= 0:
            return 0
        data = self._read_at(self._pos, count)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        # RawIOBase.readall would issue one request per 8 KiB.
        parts = []
        while self._pos < self._size:
            data = self._read_at(self._pos, min(CHUNK, self._size - self._pos))
            if not data:
                break
            parts.append(data)
            self._pos += len(data)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()


def open_stream(reader: ObjectReader, size: int, retry: Retry, action: str) -> BinaryIO:
    return io.BufferedReader(ObjectStream(reader, size, retry, action), buffer_size=CHUNK)


Replay = Callable[[], Iterator[bytes]]


@contextmanager
def replayable(data: PutSource) -> Iterator[Replay]:
    """A function giving the bytes of ``data`` chunk by chunk, as often as an upload is retried."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data)
        flat = view.cast("B") if view.contiguous else view.tobytes()
        yield lambda: iter([flat])
        return
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.isfile(path):
            raise InvalidPath(f"put source {path!r} is not a readable file")

        def from_file() -> Iterator[bytes]:
            with open(path, "rb") as file:
                yield from _chunks(file)

        yield from_file
        return
    if not hasattr(data, "read"):
        raise InvalidPath(f"put needs bytes, a binary file object or a file path, not {type(data).__name__}")
    if _seekable(data):
        start = data.tell()

        def from_start() -> Iterator[bytes]:
            data.seek(start)
            return _chunks(data)

        yield from_start
        return
    # A pipe or socket can be read once: keep a copy (on disk past 32 MiB) to replay.
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY) as spool:
        for chunk in _chunks(data):
            spool.write(chunk)

        def from_spool() -> Iterator[bytes]:
            spool.seek(0)
            return _chunks(spool)

        yield from_spool


def known_size(data: PutSource) -> int | None:
    """How many bytes ``put`` will send, when that is known without reading them."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).nbytes
    if isinstance(data, (str, os.PathLike)):
        return os.path.getsize(data) if os.path.isfile(data) else None
    if _seekable(data):
        start = data.tell()
        end = data.seek(0, os.SEEK_END)
        data.seek(start)
        return end - start
    return None


def _seekable(file: object) -> bool:
    try:
        return bool(file.seekable())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    while True:
        chunk = file.read(1024 * 1024)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise InvalidPath("put needs a binary file object; this one is open in text mode")
        yield chunk
