"""The shared memory between a node's loader processes and its trainer ranks (no torch here).

One file in ``/dev/shm`` (plain shared memory; on CUDA the trainer ranks also register it
as pinned memory) mapped by every process of the node, as 64-bit words:

* a header: the stop flag, which loader is active, the loader table (id, pid, heartbeat,
  warm), the **config** (version, cursor, skipped windows; written by local rank 0 when a
  run starts, resumes or rolls back), the **rank table** (per local rank: the config
  version it follows and its cursor, the start of the next batch it wants: the "recorded
  position", a few bytes per step), the cursor the active loader has produced up to, and
  three texts: the error at a cursor, the loader's status (why it waits) and a fatal error;
* a ring of ``slots``: each holds one global batch for every local rank (positions, and
  per rank its samples' source, index and token rows), with a state word.

Exactly one process writes each word: the active loader the slots, ``produced``, status
and error; the supervisor (in local rank 0) the active id and the fatal text; each rank
its own rank-table entry; each loader its own table entry. A slot is written as WRITING,
filled, then READY; a reader copies a READY slot and checks that it is still READY with the
same start afterwards. A slot is free when every rank's cursor is past it (or it is of an
old config), so a batch is never overwritten while a rank still wants it, and a new
active loader after a takeover needs nothing but the rank table to continue. Word stores
are ordered as written on x86-64 (total store order); that is what this relies on.
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from versioning.scratch import owned_prefix, sweep

MAGIC = 0x544C4B52494E4731  # "TLKRING1"
EMPTY, WRITING, READY = 0, 1, 2
MAX_LOADERS = 4
MAX_LOCAL_RANKS = 64
MAX_SKIPPED = 256
TEXT_BYTES = 4096

_STOP, _ACTIVE, _CONFIG_VERSION, _CONFIG_CURSOR, _SKIPPED, _PRODUCED = 1, 2, 3, 4, 5, 6
_ERROR_VERSION, _ERROR_CURSOR = 7, 8
_LOADERS = 16  # MAX_LOADERS x (id, pid, heartbeat ns, warm)
_RANKS = _LOADERS + 4 * MAX_LOADERS  # MAX_LOCAL_RANKS x (version, cursor)
_SKIP_PAIRS = _RANKS + 2 * MAX_LOCAL_RANKS
_HEADER_WORDS = _SKIP_PAIRS + 2 * MAX_SKIPPED
_TEXTS = ("error", "status", "fatal")
_TEXT_WORDS = TEXT_BYTES // 8
_SLOT_HEADER = 4  # state, version, start, end


RING_KIND = "loader"  # rings are named by their owner (versioning/scratch.py): a killed job's are swept


def shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


@dataclass(frozen=True)
class LoaderSpec:
    """Everything a loader process needs, passed as JSON on its command line (no secrets:
    a lakeFS repository's credentials come from the environment, the lakectl way)."""

    ring: str  # path of the shared-memory file
    commit_files: str  # path of a JSON file: the commit's manifest and mix, read once by the trainer
    repo: str
    commit: str
    cache_dir: str
    cache_max_bytes: int | None
    cache_protect_steps: int
    fetch_workers: int
    fetch_timeout_s: float
    fetch_ahead_steps: int
    shadow_prefetch: int
    heldout_fraction: float
    global_batch: int
    micro_batch: int
    world_size: int
    ranks: list[int]  # the node's global ranks, in local-rank order
    row_len: int  # seq_len + 1
    slots: int
    parent_pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoaderSpec:
        return cls(**json.loads(text))

    @property
    def layout(self) -> RingLayout:
        per_rank = self.global_batch // self.world_size
        return RingLayout(self.slots, len(self.ranks), self.global_batch, per_rank, self.row_len)


@dataclass(frozen=True)
class RingLayout:
    slots: int
    local_ranks: int
    global_batch: int
    per_rank: int  # samples of one rank per step
    row_len: int  # seq_len + 1

    @property
    def rank_words(self) -> int:
        return self.per_rank * (2 + self.row_len)

    @property
    def slot_words(self) -> int:
        return _SLOT_HEADER + self.global_batch + self.local_ranks * self.rank_words

    @property
    def total_words(self) -> int:
        return _HEADER_WORDS + len(_TEXTS) * _TEXT_WORDS + self.slots * self.slot_words


@dataclass(frozen=True)
class SlotBatch:
    start: int
    end: int
    positions: np.ndarray
    source: np.ndarray
    index: np.ndarray
    rows: np.ndarray  # [per_rank, row_len] int64: a view into the ring when ``copy=False``


class Ring:
    """A mapped ring file (see the module docstring for who writes what)."""

    def __init__(self, path: Path, layout: RingLayout, create: bool = False):
        if layout.local_ranks > MAX_LOCAL_RANKS:
            raise ValueError(
                f"at most {MAX_LOCAL_RANKS} ranks per node share a loader, not {layout.local_ranks}"
            )
        self.path = Path(path)
        self.layout = layout
        size = layout.total_words * 8
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.words = np.frombuffer(self._map, dtype=np.int64)
        if create:
            self.words[0] = MAGIC
        elif self.words[0] != MAGIC:
            raise ValueError(f"{self.path} is not a tokenlake loader ring")
        self._slot_base = _HEADER_WORDS + len(_TEXTS) * _TEXT_WORDS

    @classmethod
    def create(cls, layout: RingLayout, tag: str, warn: Callable[[str], None]) -> Ring:
        """A new ring, named by this process; first the rings of SIGKILLed jobs go (their owner is dead)."""
        for left in sweep(shm_dir(), RING_KIND):  # a ring and its commit file
            warn(f"removed {left.path} ({left.bytes} bytes), left by pid {left.pid}, which is dead")
        path = shm_dir() / f"{owned_prefix(RING_KIND)}{tag}-{time.monotonic_ns() % 10**9}"
        return cls(path, layout, create=True)

    def close(self, unlink: bool = False) -> None:
        self.words = None  # type: ignore[assignment]  # the buffer must be released before the map
        try:
            self._map.close()
        except BufferError:  # a view is still alive (a batch on CUDA); the mapping goes with the process
            pass
        if unlink:
            self.path.unlink(missing_ok=True)

    @property
    def base_address(self) -> int:
        """The mapping's address (the trainer registers it as pinned memory on CUDA)."""
        return self.words.ctypes.data

    # ---- flags ---------------------------------------------------------------------------

    @property
    def stop(self) -> bool:
        return bool(self.words[_STOP])

    def request_stop(self) -> None:
        self.words[_STOP] = 1

    @property
    def active(self) -> int:
        return int(self.words[_ACTIVE])

    @active.setter
    def active(self, loader_id: int) -> None:
        self.words[_ACTIVE] = loader_id

    @property
    def produced(self) -> int:
        return int(self.words[_PRODUCED])

    @produced.setter
    def produced(self, cursor: int) -> None:
        self.words[_PRODUCED] = cursor

    # ---- loader table --------------------------------------------------------------------

    def _loader(self, loader_id: int) -> int:
        return _LOADERS + 4 * (loader_id % MAX_LOADERS)

    def register(self, loader_id: int, pid: int) -> None:
        at = self._loader(loader_id)
        self.words[at + 3] = 0
        self.words[at + 1] = pid
        self.words[at + 2] = time.monotonic_ns()
        self.words[at] = loader_id

    def beat(self, loader_id: int) -> None:
        self.words[self._loader(loader_id) + 2] = time.monotonic_ns()

    def set_warm(self, loader_id: int, warm: bool) -> None:
        self.words[self._loader(loader_id) + 3] = int(warm)

    def loader(self, loader_id: int) -> tuple[bool, float, bool]:
        """(registered, seconds since its last heartbeat, warm) of a loader."""
        at = self._loader(loader_id)
        if self.words[at] != loader_id:
            return False, 0.0, False
        return True, (time.monotonic_ns() - int(self.words[at + 2])) / 1e9, bool(self.words[at + 3])

    # ---- config and rank table -------------------------------------------------------------

    def write_config(self, version: int, cursor: int, skipped: list[tuple[int, int]]) -> None:
        if len(skipped) > MAX_SKIPPED:
            raise ValueError(f"at most {MAX_SKIPPED} skipped windows fit the loader ring, not {len(skipped)}")
        self.words[_CONFIG_VERSION] = -1
        self.words[_CONFIG_CURSOR] = cursor
        self.words[_SKIPPED] = len(skipped)
        for i, (start, end) in enumerate(skipped):
            self.words[_SKIP_PAIRS + 2 * i] = start
            self.words[_SKIP_PAIRS + 2 * i + 1] = end
        self.words[_CONFIG_VERSION] = version

    def read_config(self) -> tuple[int, int, list[tuple[int, int]]] | None:
        """(version, cursor, skipped), or None before the first config or while one is written."""
        version = int(self.words[_CONFIG_VERSION])
        cursor, count = int(self.words[_CONFIG_CURSOR]), int(self.words[_SKIPPED])
        pairs = self.words[_SKIP_PAIRS : _SKIP_PAIRS + 2 * count].tolist()
        if version < 1 or int(self.words[_CONFIG_VERSION]) != version:
            return None
        return version, cursor, [(pairs[2 * i], pairs[2 * i + 1]) for i in range(count)]

    def set_rank(self, local: int, version: int, cursor: int) -> None:
        at = _RANKS + 2 * local
        self.words[at] = -1
        self.words[at + 1] = cursor
        self.words[at] = version

    def lowest_cursor(self) -> int:
        """The lowest cursor any rank has recorded, whatever config it follows."""
        return int(self.words[_RANKS + 1 : _RANKS + 2 * self.layout.local_ranks : 2].min())

    def resume_cursor(self, version: int, fallback: int) -> int:
        """The lowest cursor of the ranks following ``version``: where a loader (re)starts."""
        table = self.words[_RANKS : _RANKS + 2 * self.layout.local_ranks].reshape(-1, 2)
        following = table[table[:, 0] == version, 1]
        return int(following.min()) if len(following) else fallback

    # ---- texts ---------------------------------------------------------------------------

    def _text_at(self, name: str) -> int:
        return _HEADER_WORDS + _TEXTS.index(name) * _TEXT_WORDS

    def set_text(self, name: str, text: str) -> None:
        at = self._text_at(name)
        data = text.encode()[: TEXT_BYTES - 8]
        self.words[at] = 0
        self._map[(at + 1) * 8 : (at + 1) * 8 + len(data)] = data
        self.words[at] = len(data)

    def text(self, name: str) -> str:
        at = self._text_at(name)
        length = int(self.words[at])
        return self._map[(at + 1) * 8 : (at + 1) * 8 + length].decode(errors="replace")

    def set_error(self, version: int, cursor: int, message: str) -> None:
        """The batch at ``cursor`` under config ``version`` cannot be assembled: ``message`` says why."""
        self.words[_ERROR_VERSION] = -1
        self.set_text("error", message)
        self.words[_ERROR_CURSOR] = cursor
        self.words[_ERROR_VERSION] = version

    def error(self, version: int, cursor: int) -> str | None:
        if int(self.words[_ERROR_VERSION]) == version and int(self.words[_ERROR_CURSOR]) == cursor:
            return self.text("error")
        return None

    # ---- slots ---------------------------------------------------------------------------

    def _slot(self, k: int) -> int:
        return self._slot_base + k * self.layout.slot_words

    def find_slot(self, version: int, start: int) -> int | None:
        for k in range(self.layout.slots):
            at = self._slot(k)
            if self.words[at] == READY and self.words[at + 1] == version and self.words[at + 2] == start:
                return k
        return None

    def free_slot(self, version: int) -> int | None:
        """A slot no rank still wants: not READY, of another config, or behind every rank's cursor."""
        table = self.words[_RANKS : _RANKS + 2 * self.layout.local_ranks].reshape(-1, 2)
        for k in range(self.layout.slots):
            at = self._slot(k)
            state, slot_version, end = self.words[at], self.words[at + 1], self.words[at + 3]
            if state != READY or slot_version != version:
                return k
            if np.all((table[:, 0] == version) & (table[:, 1] >= end)):
                return k
        return None

    def write_slot(
        self, k: int, version: int, start: int, end: int, positions: np.ndarray, per_rank: list[tuple]
    ) -> None:
        """``per_rank``: (source, index, rows) of each local rank, in local-rank order."""
        layout, at = self.layout, self._slot(k)
        self.words[at] = WRITING
        body = at + _SLOT_HEADER
        self.words[body : body + layout.global_batch] = positions
        for r, (source, index, rows) in enumerate(per_rank):
            base = body + layout.global_batch + r * layout.rank_words
            n = layout.per_rank
            self.words[base : base + n] = source
            self.words[base + n : base + 2 * n] = index
            self.words[base + 2 * n : base + layout.rank_words] = rows.reshape(-1)
        self.words[at + 1] = version
        self.words[at + 2] = start
        self.words[at + 3] = end
        self.words[at] = READY

    def read_slot(self, k: int, local: int, copy: bool = True) -> SlotBatch | None:
        """Rank ``local``'s part of slot ``k``; None if the slot changed while it was read."""
        layout, at = self.layout, self._slot(k)
        start, end = int(self.words[at + 2]), int(self.words[at + 3])
        body = at + _SLOT_HEADER
        n = layout.per_rank
        base = body + layout.global_batch + local * layout.rank_words
        rows = self.words[base + 2 * n : base + layout.rank_words].reshape(n, layout.row_len)
        batch = SlotBatch(
            start,
            end,
            self.words[body : body + layout.global_batch].copy(),
            self.words[base : base + n].copy(),
            self.words[base + n : base + 2 * n].copy(),
            rows.copy() if copy else rows,
        )
        if self.words[at] != READY or int(self.words[at + 2]) != start:
            return None
        return batch
