"""Loader processes with a shadow, per node, and the trainer's side of them.

::

    node ──────────────────────────────────────────────────────────────────────────────
     trainer rank 0 (local 0)        trainer rank 1 ...     loader A (active)   loader B (shadow)
      ├ LoaderSupervisor thread ── starts, watches (exit, heartbeat), promotes B, starts C
      └ ProcessLoader ◄─────┐        ProcessLoader ◄──┐       │ writes batches      │ follows the ranks'
                            │                         │       ▼                     │ cursors, keeps its
                       /dev/shm ring: [config | rank cursors | loaders | slot 0 | slot 1 | ...]
                                                                      │             │ own prefetch warm
                       shard cache (bounded, shared, verified) ◄──────┴─────────────┘

:func:`make_loader` builds the loader a config asks for: ``data.loader = "process"`` (the
default) or ``"thread"`` (:class:`training.data.Loader`, in the trainer process). Both
hand out the same batches, so a run's losses do not depend on the choice.

* :class:`LoaderSupervisor` (local rank 0) starts the active loader and a shadow
  (:mod:`training.loader_process`). It watches the active one: when it exits (SIGKILL, a
  crash) or its heartbeat is older than ``data.loader_timeout_s`` (it stopped answering:
  it is then killed), the shadow is made active at the ranks' recorded cursors and a new
  shadow is started. Training goes on; the step that needs a batch the dead loader had not
  written waits for the new active one. A loader that keeps failing without the ranks
  moving on (three times) is a fatal error, and so is a batch that cannot be assembled
  (the active loader records the error at its cursor; a shard that fails verification
  twice is one).
* :class:`ProcessLoader` is a rank's end: the same Stateful interface as the thread loader
  (cursor and skipped windows, so checkpoints and exact resume are unchanged). It copies
  its part of the next batch out of the ring, or on CUDA copies it straight to the device
  from the ring registered as pinned memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import TrainConfig
from training.data import Batch, Loader
from training.distributed import DistContext
from training.errors import TrainingError
from training.loader_ring import LoaderSpec, Ring, RingLayout
from training.samples import CommitFiles, DataError, TokenDataset, rank_slice
from training.streaming import ShardStream

Notify = Callable[[dict[str, Any]], None]
"""Receives the loader's reports (data-wait warnings, takeovers) as metrics records with a ``message``."""

_STARTUP_TIMEOUT_S = 300.0  # a loader process that has not registered after this is replaced
_MAX_FAILURES_WITHOUT_PROGRESS = 3


class LoaderSupervisor:
    """Keeps one active loader process and one warm shadow running for this node."""

    def __init__(
        self, spec: LoaderSpec, ring: Ring, timeout_s: float, status_path: Path, warn: Callable[[str], None]
    ):
        self.spec = spec
        self.ring = ring
        self.timeout_s = timeout_s
        self.status_path = status_path
        self._warn = warn
        self._procs: dict[int, tuple[subprocess.Popen, float]] = {}  # id -> (process, start time)
        self._next_id = 1
        self.active_id = 0
        self.shadow_id = 0
        self.takeovers: list[dict[str, Any]] = []
        self._unreported: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failures_at: tuple[int, int] = (-1, 0)  # (ranks' lowest cursor, failures there)
        self.error: str | None = None
        self._thread = threading.Thread(target=self._watch, name="loader-supervisor", daemon=True)

    def start(self) -> LoaderSupervisor:
        self.active_id = self._spawn()
        self.ring.active = self.active_id
        self.shadow_id = self._spawn()
        self._write_status()
        self._thread.start()
        return self

    def _spawn(self) -> int:
        loader_id, self._next_id = self._next_id, self._next_id + 1
        process = subprocess.Popen(
            [sys.executable, "-m", "training.loader_process", self.spec.to_json(), str(loader_id)],
            stdin=subprocess.DEVNULL,
        )
        self._procs[loader_id] = (process, time.monotonic())
        return loader_id

    def pid(self, loader_id: int) -> int:
        return self._procs[loader_id][0].pid

    def _unresponsive_for(self, loader_id: int) -> float | None:
        """Seconds past its deadline the loader has been silent, or None if it is answering."""
        process, started = self._procs[loader_id]
        registered, silent, _ = self.ring.loader(loader_id)
        if not registered:
            overdue = time.monotonic() - started - _STARTUP_TIMEOUT_S
            return overdue + _STARTUP_TIMEOUT_S if overdue > 0 else None
        return silent if silent > self.timeout_s else None

    def _watch(self) -> None:
        try:
            while not self._stop.wait(0.02):
                with self._lock:
                    if self.error is not None:
                        continue
                    active, _ = self._procs[self.active_id]
                    status = active.poll()
                    if status is not None:
                        how = (
                            f"was killed by signal {-status}"
                            if status < 0
                            else f"exited with status {status}"
                        )
                        self._take_over(f"the active loader (pid {active.pid}) {how}")
                    elif (silent := self._unresponsive_for(self.active_id)) is not None:
                        self._take_over(
                            f"the active loader (pid {active.pid}) stopped answering: no heartbeat for {silent:.1f} s "
                            "(data.loader_timeout_s)"
                        )
                    shadow, _ = self._procs[self.shadow_id]
                    if shadow.poll() is not None or self._unresponsive_for(self.shadow_id) is not None:
                        self._retire(self.shadow_id)
                        self.shadow_id = self._spawn()
                        self._write_status()
        except BaseException as exc:  # the ranks see it instead of waiting forever
            self.error = f"the loader supervisor failed: {type(exc).__name__}: {exc}"
            self.ring.set_text("fatal", self.error)

    def _retire(self, loader_id: int) -> None:
        process, _ = self._procs.pop(loader_id)
        if process.poll() is None:
            process.kill()  # SIGKILL also ends a stopped process
        process.wait()

    def _take_over(self, reason: str) -> None:
        """Make the shadow active at the ranks' recorded cursors; start a new shadow."""
        started = time.monotonic()
        self._retire(self.active_id)
        floor = self.ring.lowest_cursor()
        cursor, failures = self._failures_at
        failures = failures + 1 if floor == cursor else 1
        self._failures_at = (floor, failures)
        if failures >= _MAX_FAILURES_WITHOUT_PROGRESS:
            self.error = (
                f"the loader failed {failures} times in a row while the ranks waited at sample position {floor} "
                f"(last: {reason}); its output above says why"
            )
            self.ring.set_text("fatal", self.error)
            return
        shadow_alive = self._procs[self.shadow_id][0].poll() is None
        warm = shadow_alive and self.ring.loader(self.shadow_id)[2]
        if shadow_alive:
            self.active_id = self.shadow_id
        else:
            self._retire(self.shadow_id)
            self.active_id = self._spawn()
        self.ring.active = self.active_id
        self.shadow_id = self._spawn()
        event = {
            "kind": "loader_takeover",
            "reason": reason,
            "from_shadow": shadow_alive,  # else a cold loader was started in its place
            "warm_shadow": warm,
            "new_active_pid": self.pid(self.active_id),
            "takeover_ms": 1000 * (time.monotonic() - started),
            "time": time.time(),
            "message": f"{reason}; the {'warm ' if warm else ''}shadow (pid {self.pid(self.active_id)}) took over "
            "at the recorded position",
        }
        self.takeovers.append(event)
        self._unreported.append(event)
        self._write_status()

    def reported(self) -> list[dict[str, Any]]:
        """Takeovers not yet handed to the trainer's metrics."""
        with self._lock:
            events, self._unreported = self._unreported, []
        return events

    def signal_active(self, signum: int, timeout_s: float = 120.0) -> int:
        """Tests: send ``signum`` to the active loader once it is running and the shadow is warm
        (not to one whose death the watcher has yet to handle); returns its pid."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                active, _ = self._procs[self.active_id]
                ready = active.poll() is None and self.ring.loader(self.shadow_id)[2]
                if ready or time.monotonic() > deadline:
                    os.kill(active.pid, signum)
                    return active.pid
            time.sleep(0.005)

    def _write_status(self) -> None:
        status = {
            "active": {"id": self.active_id, "pid": self.pid(self.active_id)},
            "shadow": {"id": self.shadow_id, "pid": self.pid(self.shadow_id)},
            "takeovers": len(self.takeovers),
            "ring": str(self.ring.path),
        }
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        os.replace(tmp, self.status_path)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.ring.request_stop()
        deadline = time.monotonic() + 5.0
        for process, _ in self._procs.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._procs.clear()


class ProcessLoader:
    """This rank's batches from the node's loader process (the thread loader's interface)."""

    def __init__(
        self,
        ring: Ring,
        local: int,
        rank: int,
        world_size: int,
        global_batch: int,
        micro_batch: int,
        device: torch.device,
        supervisor: LoaderSupervisor | None,
        notify: Notify | None,
        wait_warning_s: float,
        kill_at_batches: tuple[int, ...] = (),
        stop_at_batches: tuple[int, ...] = (),
    ):
        self.ring = ring
        self.local = local
        self.rank = rank
        self.world_size = world_size
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.accumulation = global_batch // (micro_batch * world_size)
        self.device = device
        self.supervisor = supervisor
        self.notify = notify
        self.wait_warning_s = wait_warning_s
        self.cursor = 0
        self.skipped: list[tuple[int, int]] = []
        self.wait_seconds = 0.0
        self.longest_wait_s = 0.0
        self._version = 0
        self._dirty = True  # the config and this rank's entry are written at the next batch
        self._handed_out = 0
        self._faults = {n: signal.SIGKILL for n in kill_at_batches} | {
            n: signal.SIGSTOP for n in stop_at_batches
        }
        self._pinned = device.type == "cuda" and _register_pinned(ring)
        self._in_flight: torch.cuda.Event | None = None  # the last copy from the ring to the device
        self._closed = False

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "skipped": [list(w) for w in self.skipped]}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.skipped = sorted((int(a), int(b)) for a, b in state["skipped"])
        self._version += 1
        self._dirty = True

    def skip(self, start: int, end: int) -> None:
        self.skipped = sorted({*self.skipped, (start, end)})
        self._version += 1
        self._dirty = True

    def my_slice(self, positions: np.ndarray) -> np.ndarray:
        return rank_slice(positions, self.rank, self.world_size, self.micro_batch)

    def _publish(self) -> None:
        """Write the config (local rank 0) and this rank's (version, cursor): the recorded position."""
        if self._in_flight is not None:
            self._in_flight.synchronize()  # the ring slot may be reused once the cursor moves on
            self._in_flight = None
        if self._dirty and self.local == 0:
            self.ring.write_config(self._version + 1, self.cursor, self.skipped)
        self.ring.set_rank(self.local, self._version + 1, self.cursor)
        self._dirty = False

    def _check(self) -> None:
        fatal = self.ring.text("fatal")
        if fatal:
            raise TrainingError(fatal)
        error = self.ring.error(self._version + 1, self.cursor)
        if error:
            raise DataError(error)

    def next_batch(self) -> Batch:
        self._publish()
        started = time.perf_counter()
        warned, pause = "", 0.0002
        while True:
            slot = self.ring.find_slot(self._version + 1, self.cursor)
            if slot is not None:
                got = self.ring.read_slot(slot, self.local, copy=not self._pinned)
                if got is not None:
                    break
            self._check()
            waited = time.perf_counter() - started
            if self.notify and waited >= self.wait_warning_s:
                reason = self.ring.text("status") or "the loader process has not produced it yet"
                if reason != warned:
                    warned = reason
                    self.notify({"kind": "data_wait", "waited_s": waited, "reason": reason,
                                 "message": f"waiting {waited:.1f} s for data: {reason}"})  # fmt: skip
            self._report_takeovers()
            time.sleep(pause)
            pause = min(0.002, pause * 2)
        self.wait_seconds = time.perf_counter() - started
        self.longest_wait_s = max(self.longest_wait_s, self.wait_seconds)
        tokens = torch.from_numpy(got.rows).view(self.accumulation, self.micro_batch, -1)
        if self._pinned:
            tokens = tokens.to(self.device, non_blocking=True)
            self._in_flight = torch.cuda.Event()
            self._in_flight.record()
        self.cursor = got.end
        self._report_takeovers()
        self._handed_out += 1
        self._inject_fault()
        return Batch(got.start, got.end, got.positions, tokens, got.source, got.index)

    def _report_takeovers(self) -> None:
        if self.supervisor is not None and self.notify is not None:
            for event in self.supervisor.reported():
                self.notify(event)

    def _inject_fault(self) -> None:
        """Tests: signal the active loader as this rank hands out its N-th batch, once the shadow is warm."""
        signum = self._faults.get(self._handed_out)
        if signum is None or self.supervisor is None:
            return
        pid = self.supervisor.signal_active(signum)
        if self.notify:  # the test finds this loader's takeover by its pid
            name = signal.Signals(signum).name
            self.notify({"kind": "loader_fault", "pid": pid, "signal": name, "batch": self._handed_out,
                         "message": f"fault injected: {name} sent to the active loader (pid {pid})"})  # fmt: skip

    def report(self) -> dict[str, Any]:
        takeovers = self.supervisor.takeovers if self.supervisor else []
        return {
            "loader": "process",
            "takeovers": len(takeovers),
            "shadow_takeovers": sum(t["from_shadow"] for t in takeovers),
            "warm_takeovers": sum(t["warm_shadow"] for t in takeovers),
            "longest_data_wait_ms": 1000 * self.longest_wait_s,
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._in_flight is not None:
            self._in_flight.synchronize()
            self._in_flight = None
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.ring.base_address)
        if self.supervisor is not None:
            self.supervisor.close()
            Path(self.supervisor.spec.commit_files).unlink(missing_ok=True)
        self.ring.close(unlink=self.supervisor is not None)


def _register_pinned(ring: Ring) -> bool:
    """Page-lock the ring for asynchronous copies to the GPU (cudaHostRegister); False if refused
    (batches are then copied out of the ring, as on CPU)."""
    size = ring.layout.total_words * 8
    try:
        return int(torch.cuda.cudart().cudaHostRegister(ring.base_address, size, 0)) == 0
    except (RuntimeError, AttributeError, TypeError):
        return False


def make_loader(
    config: TrainConfig,
    dist: DistContext,
    dataset: TokenDataset,
    stream: ShardStream,
    files: CommitFiles,
    commit: str,
    repo_spec: str,
    micro_batch: int,
    notify: Notify,
    warn: Callable[[str], None],
) -> Loader | ProcessLoader:
    """The loader ``data.loader`` asks for (collective: every rank calls it)."""
    data = config.data
    if data.loader == "thread":
        return Loader(
            dataset, config.global_batch, micro_batch, dist.rank, dist.world_size, data.prefetch_batches,
            pin_memory=dist.device.type == "cuda", stream=stream, lookahead=data.fetch_ahead_steps,
            notify=notify, wait_warning_s=data.wait_warning_s,
        )  # fmt: skip
    node = int(os.environ.get("GROUP_RANK", "0"))
    members = dist.gather((node, dist.local_rank, dist.rank))
    ranks = [rank for _, _, rank in sorted(m for m in members if m[0] == node)]
    spec_path = ring = None
    layout = RingLayout(
        data.prefetch_batches + 1, len(ranks), config.global_batch, config.global_batch // dist.world_size,
        dataset.seq_len + 1,
    )  # fmt: skip
    if dist.local_rank == 0:
        ring = Ring.create(layout, f"node{node}", warn)
        spec_path = Path(f"{ring.path}.commit.json")
        spec_path.write_text(json.dumps({"manifest": files.manifest.decode(), "mix": files.mix.decode(),
                                         "tokenizer_sha256": files.tokenizer_sha256}))  # fmt: skip
    paths = dist.gather((node, dist.local_rank, str(ring.path) if ring else None))
    if ring is None:
        ring = Ring(Path(next(p for n, local, p in paths if n == node and local == 0)), layout)
    supervisor = None
    if dist.local_rank == 0:
        spec = LoaderSpec(
            ring=str(ring.path), commit_files=str(spec_path), repo=repo_spec, commit=commit,
            cache_dir=str(config.cache_dir()), cache_max_bytes=data.cache_max_bytes,
            cache_protect_steps=data.cache_protect_steps, fetch_workers=data.fetch_workers,
            fetch_timeout_s=data.fetch_timeout_s, fetch_ahead_steps=data.fetch_ahead_steps,
            shadow_prefetch=data.shadow_prefetch_batches, heldout_fraction=data.heldout_fraction,
            global_batch=config.global_batch, micro_batch=micro_batch, world_size=dist.world_size, ranks=ranks,
            row_len=dataset.seq_len + 1, slots=layout.slots, parent_pid=os.getpid(),
        )  # fmt: skip
        status = config.run_dir() / "loaders"
        status.mkdir(parents=True, exist_ok=True)
        supervisor = LoaderSupervisor(
            spec, ring, data.loader_timeout_s, status / f"node-{node}.json", warn
        ).start()
    faults = config.faults
    return ProcessLoader(
        ring, ranks.index(dist.rank), dist.rank, dist.world_size, config.global_batch, micro_batch, dist.device,
        supervisor, notify, data.wait_warning_s, faults.kill_loader_at_batches, faults.stop_loader_at_batches,
    )  # fmt: skip
