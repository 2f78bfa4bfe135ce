"""The node's shard cache: verified copies of shards, bounded in size, shared by every process.

Layout under the cache root (default ``<home>/cache/shards``)::

    <sha[:2]>/<sha256>.bin      a verified shard, named by its manifest sha256
    .tmp/<sha>_<bytes>_....part  a download in progress; its manifest size is reserved
    .readers/<reader>.json       what one reader (a loader, a trainer rank) needs next, by distance in steps
    .locks/<sha[:3]>.lock        one fetch per shard: fetchers of a shard take its lock (flock)
    .lock                        the index lock: reserving room and evicting happen under it
    .stats.json                  fetches, evictions, peak bytes, over-cap events (this cache directory's)

Every process on a node (the loader processes, the shadow, each rank's trainer) opens the
same root. A shard is fetched once: the fetcher holds the shard's lock while it downloads
into ``.tmp``, hashing as it writes, and renames the file into place only when its sha256
is the manifest's; a process that wanted the same shard waits on the lock and then finds
the file. A killed fetcher leaves a ``.part`` file that the next reservation removes (its
pid is dead) and a lock the kernel has already released.

**Cap.** With ``max_bytes`` set, room for a shard is made before its download starts,
under the index lock: the shards no reader needs go first (oldest first), then
those needed furthest ahead; a shard needed within ``protect_steps`` steps of any reader's
read position is never evicted, and neither is one needed sooner than the shard being
fetched. When that frees too little, a shard needed beyond the protected window is not
fetched yet (:meth:`ShardCache.fetch` returns None: the fetcher retries once the read
position has moved); a shard inside it is fetched anyway and the overshoot is reported
once, with the size the protected window needed. Readers publish their needs in
``.readers/`` (:class:`CacheReader`); a reader whose process is gone stops counting.

**Verification.** A download whose sha256 is not the manifest's is fetched again once,
then fails naming the shard. A file already in the cache is hashed the first time a
process uses it; a corrupt one is fetched again.

Assumes one node per cache root for liveness (pids are checked on this host; a reader
file from another host counts while it is younger than ten minutes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from formats.digest import file_sha256
from formats.shards import ShardEntry
from training.samples import DataError
from versioning import DataRepo
from versioning.liveness import pid_alive
from versioning.scratch import HOST

_FOREIGN_READER_TTL_S = 600.0
_CHUNK = 8 << 20


def _signature(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten or replaced: inode, size, modification time."""
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_json_atomically(path: Path, content: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)


class ShardCache:
    """Local copies of shards, named by their sha256, checked against the manifest before use."""

    def __init__(
        self,
        root: Path,
        warn: Callable[[str], None] = print,
        max_bytes: int | None = None,
        protect_steps: int = 2,
    ):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.protect_steps = protect_steps
        self._warn = warn
        self._verified: dict[str, tuple[int, int, int]] = {}  # sha256 -> file signature when hashed
        self._guard = threading.Lock()
        self._over_cap_warned = False
        for sub in (".tmp", ".readers", ".locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.bin"

    def reader(self) -> CacheReader:
        return CacheReader(self.root / ".readers")

    # ---- fetching ------------------------------------------------------------------------

    def fetch(self, repo: DataRepo, commit: str, entry: ShardEntry, distance: int = 0) -> Path | None:
        """The verified local path of ``entry``, fetched when absent or corrupt.

        ``distance``: in how many steps the caller needs it. None when the cache is full of
        shards needed sooner (only for a shard needed beyond ``protect_steps``). Transient
        repository errors propagate (the caller decides how long to wait)."""
        path = self.path_for(entry.sha256)
        with _flock(self.root / ".locks" / f"{entry.sha256[:3]}.lock"):
            if path.exists() and self._verified_in_place(entry, path):
                return path
            actual = ""
            for attempt in (1, 2):
                reservation = self._reserve(entry, distance)
                if reservation is None:
                    return None
                try:
                    actual = self._download(repo, commit, entry, reservation)
                    if actual == entry.sha256:
                        # read before the rename (which keeps inode, size and time): once in place,
                        # another fetcher making room may evict it at any moment
                        signature = _signature(reservation)
                        path.parent.mkdir(exist_ok=True)
                        os.replace(reservation, path)
                        self._count_fetch(entry)
                        with self._guard:
                            self._verified[entry.sha256] = signature
                        return path
                finally:
                    reservation.unlink(missing_ok=True)
                if attempt == 1:
                    self._warn(
                        f"{entry.name} at {commit[:12]} arrived with sha256 {actual[:12]}; fetching again"
                    )
        raise DataError(
            f"shard {entry.name} at commit {commit} has sha256 {actual} but shards/manifest.json says "
            f"{entry.sha256} (fetched twice): the commit is inconsistent; re-run the shard stage or pick "
            "another commit"
        )

    def _verified_in_place(self, entry: ShardEntry, path: Path) -> bool:
        """Whether the cached file is good; a corrupt one is removed. A file is hashed the first
        time this process uses it, and again whenever it has changed on disk since."""
        try:
            signature = _signature(path)
        except FileNotFoundError:
            return False
        with self._guard:
            known = self._verified.get(entry.sha256) == signature
        if known:
            return True
        if file_sha256(path) != entry.sha256:
            self._warn(f"cached {entry.name} ({path.name}) is corrupt; fetching it again")
            path.unlink(missing_ok=True)
            return False
        with self._guard:
            self._verified[entry.sha256] = signature
        return True

    def _download(self, repo: DataRepo, commit: str, entry: ShardEntry, target: Path) -> str:
        digest = hashlib.sha256()
        written = 0
        with repo.open(commit, entry.name) as src, target.open("wb") as dst:
            # a wrong object much larger than the manifest says must not fill the disk
            while written <= entry.bytes and (chunk := src.read(_CHUNK)):
                digest.update(chunk)
                dst.write(chunk)
                written += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        return digest.hexdigest()

    # ---- room, eviction, accounting --------------------------------------------------------

    def _reserve(self, entry: ShardEntry, distance: int) -> Path | None:
        """Make room for ``entry`` and hold it with an empty ``.part`` file (its name carries the
        manifest size, which counts against the cap until the download is renamed into place)."""
        with _flock(self.root / ".lock"):
            files = self._cached_files()
            used = sum(size for _, size, _ in files.values()) + self._reserved_bytes()
            need = entry.bytes
            stats = self._read_stats()
            if self.max_bytes is not None and used + need > self.max_bytes:
                used = self._evict(files, used, need, max(self.protect_steps, distance), stats)
                if used + need > self.max_bytes:
                    if distance > self.protect_steps:
                        return None
                    stats["over_cap_bytes"] = max(
                        stats.get("over_cap_bytes", 0), used + need - self.max_bytes
                    )
                    if not self._over_cap_warned:
                        self._over_cap_warned = True
                        self._warn(
                            f"the shard cache needs {used + need} bytes for the shards of the next "
                            f"{self.protect_steps + 1} steps, over its cap of {self.max_bytes}: raise "
                            "data.cache_max_bytes or lower data.cache_protect_steps"
                        )
            reservation = (
                self.root
                / ".tmp"
                / (f"{entry.sha256}_{need}_{HOST}_{os.getpid()}_{threading.get_ident()}.part")
            )
            reservation.touch()
            stats["peak_bytes"] = max(stats.get("peak_bytes", 0), used + need)
            self._write_stats(stats)
            return reservation

    def _evict(
        self, files: dict[str, tuple[Path, int, float]], used: int, need: int, keep_within: int, stats: dict
    ) -> int:
        """Delete cached shards not needed within ``keep_within`` steps, least needed first, until
        ``need`` more bytes fit; returns the bytes in use afterwards."""
        distances = self.needed_within()
        victims = sorted(
            (sha for sha in files if distances.get(sha, math.inf) > keep_within),
            key=lambda sha: (-distances.get(sha, math.inf), files[sha][2]),
        )
        for sha in victims:
            if used + need <= self.max_bytes:
                break
            path, size, _ = files[sha]
            path.unlink(missing_ok=True)
            used -= size
            stats["evicted"] = stats.get("evicted", 0) + 1
            with self._guard:
                self._verified.pop(sha, None)
        return used

    def _cached_files(self) -> dict[str, tuple[Path, int, float]]:
        """sha256 -> (path, size, mtime) of every shard in the cache."""
        found = {}
        for sub in self.root.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for item in os.scandir(sub):
                if item.name.endswith(".bin"):
                    try:
                        st = item.stat()
                    except FileNotFoundError:
                        continue
                    found[item.name[:-4]] = (Path(item.path), st.st_size, st.st_mtime)
        return found

    def _reserved_bytes(self) -> int:
        """Bytes held by downloads in progress; those of dead processes are cleared."""
        total = 0
        for item in os.scandir(self.root / ".tmp"):
            parts = item.name.removesuffix(".part").split("_")
            if len(parts) != 5:
                continue
            _, size, host, pid, _ = parts
            if host == HOST and not pid_alive(int(pid)):
                Path(item.path).unlink(missing_ok=True)
                continue
            total += int(size)
        return total

    def needed_within(self) -> dict[str, int]:
        """sha256 -> the fewest steps until any live reader needs it."""
        distances: dict[str, int] = {}
        now = time.time()
        for item in os.scandir(self.root / ".readers"):
            if not item.name.endswith(".json"):
                continue
            try:
                content = json.loads(Path(item.path).read_text())
                stale = now - item.stat().st_mtime > _FOREIGN_READER_TTL_S
            except (OSError, ValueError):
                continue
            if content["host"] == HOST:
                if not pid_alive(content["pid"]):
                    Path(item.path).unlink(missing_ok=True)
                    continue
            elif stale:
                continue
            for sha, distance in content["needs"].items():
                distances[sha] = min(distances.get(sha, distance), distance)
        return distances

    def usage(self) -> int:
        """Bytes of the shards in the cache now."""
        return sum(size for _, size, _ in self._cached_files().values())

    def _count_fetch(self, entry: ShardEntry) -> None:
        with _flock(self.root / ".lock"):
            stats = self._read_stats()
            stats["fetched"] = stats.get("fetched", 0) + 1
            stats["fetched_bytes"] = stats.get("fetched_bytes", 0) + entry.bytes
            self._write_stats(stats)

    def stats(self) -> dict[str, int]:
        """Counters of this cache directory: fetched, fetched_bytes, evicted, peak_bytes, over_cap_bytes."""
        with _flock(self.root / ".lock"):
            return {"fetched": 0, "fetched_bytes": 0, "evicted": 0, "peak_bytes": 0, "over_cap_bytes": 0} | (
                self._read_stats()
            )

    def _read_stats(self) -> dict[str, int]:
        try:
            return json.loads((self.root / ".stats.json").read_text())
        except (OSError, ValueError):
            return {}

    def _write_stats(self, stats: dict[str, int]) -> None:
        _write_json_atomically(self.root / ".stats.json", stats)


class CacheReader:
    """One reader's needs, published for the evictor: shard sha256 -> steps until it is read."""

    _count = 0
    _count_guard = threading.Lock()

    def __init__(self, directory: Path):
        with CacheReader._count_guard:
            CacheReader._count += 1
            number = CacheReader._count
        self.path = directory / f"{HOST}-{os.getpid()}-{number}.json"
        self._last: dict[str, int] | None = None

    def set_needs(self, needs: dict[str, int]) -> None:
        if needs != self._last:
            _write_json_atomically(self.path, {"host": HOST, "pid": os.getpid(), "needs": needs})
            self._last = dict(needs)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
