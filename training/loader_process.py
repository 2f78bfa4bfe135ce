"""A node's loader process: ``python -m training.loader_process SPEC_JSON LOADER_ID``.

The supervisor in local rank 0 (:class:`training.loader_pool.LoaderSupervisor`) starts two:
the **active** loader, named by the ring's active id, assembles the global batches of the
node's ranks into the shared-memory ring (:mod:`training.loader_ring`); the **shadow**
follows the cursors the ranks record there, keeps its own ``shadow_prefetch`` batches
assembled from that position (and their shards wanted in the cache), and says when it is
warm. When the supervisor makes the shadow active (the active one died or stopped
answering), it writes what it holds and goes on from the ranks' cursors: nothing else is
needed, because a batch is a pure function of (mix plan, cursor, skipped windows).

A loader beats a heartbeat word while it works and while it waits for shards, and exits
when the supervisor asks or when its parent (the trainer rank) is gone; the last one of an
orphaned node removes the ring file. No torch: it starts in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path

from training.loader_ring import LoaderSpec, Ring
from training.samples import CommitFiles, DataError, TokenDataset, bind
from training.shard_cache import ShardCache
from training.streaming import AssembledBatch, BatchPlanner, ShardStream
from versioning import open_repo

_MIN_PAUSE_S, _MAX_PAUSE_S = 0.0005, 0.005


class _Stopped(Exception):
    """The supervisor asked this loader to stop, or its trainer process is gone."""


class LoaderProcess:
    def __init__(self, spec: LoaderSpec, loader_id: int):
        self.spec = spec
        self.id = loader_id
        self.ring = Ring(Path(spec.ring), spec.layout)
        stored = json.loads(Path(spec.commit_files).read_text())
        files = CommitFiles(stored["manifest"].encode(), stored["mix"].encode(), stored["tokenizer_sha256"])
        _, manifest, plan = bind(files, spec.repo, spec.commit)
        cache = ShardCache(
            Path(spec.cache_dir),
            warn=self.say,
            max_bytes=spec.cache_max_bytes,
            protect_steps=spec.cache_protect_steps,
        )
        self.dataset = TokenDataset(
            manifest, plan, spec.heldout_fraction, lambda shard: self.stream.array(shard)
        )
        self.stream = ShardStream(
            cache,
            lambda: open_repo(spec.repo, create=False),
            spec.commit,
            self.dataset,
            workers=spec.fetch_workers,
            fetch_timeout_s=spec.fetch_timeout_s,
            heartbeat=self.beat,
            warn=self.say,
        )
        self.planner = BatchPlanner(
            self.dataset, spec.global_batch, spec.micro_batch, spec.world_size, spec.ranks, spec.shadow_prefetch,
            self.stream,
        )  # fmt: skip
        self.version = 0
        self.config_cursor = 0
        self.skipped: list[tuple[int, int]] = []
        self.ready: deque[AssembledBatch] = deque()  # assembled, not yet in the ring
        self.stuck = False  # the next batch cannot be assembled (an error is recorded)
        self._status = ""
        self._pause = _MIN_PAUSE_S  # idle polls back off, and come back to the minimum on work
        # registered once ready: until then the supervisor allows a start-up time, not a heartbeat gap
        self.ring.register(loader_id, os.getpid())

    def idle(self) -> None:
        time.sleep(self._pause)
        self._pause = min(_MAX_PAUSE_S, self._pause * 2)

    def worked(self) -> None:
        self._pause = _MIN_PAUSE_S

    def say(self, message: str) -> None:
        print(f"[loader {self.id} pid {os.getpid()}] {message}", file=sys.stderr, flush=True)

    def beat(self) -> None:
        if self.ring.stop or self.orphaned():  # also ends a wait for a shard that may never come
            raise _Stopped
        self.ring.beat(self.id)
        if self.ring.active == self.id and self.stream.reason != self._status:
            self._status = self.stream.reason
            self.ring.set_text("status", self._status)

    def orphaned(self) -> bool:
        return os.getppid() != self.spec.parent_pid

    def run(self) -> None:
        try:
            while True:
                self.beat()
                if self.ring.active == self.id:
                    self.planner.lookahead = self.spec.fetch_ahead_steps
                    self._active_step()
                else:
                    self.planner.lookahead = self.spec.shadow_prefetch
                    self._shadow_step()
        except _Stopped:
            pass
        finally:
            self.stream.close()
            if self.orphaned():  # nobody else will remove the ring
                self.ring.path.unlink(missing_ok=True)
                Path(self.spec.commit_files).unlink(missing_ok=True)

    def _sync(self) -> bool:
        """Follow the config the ranks wrote; False before there is one."""
        config = self.ring.read_config()
        if config is None:
            return False
        version, cursor, skipped = config
        if version != self.version:
            self.version, self.config_cursor, self.skipped = version, cursor, skipped
            self.ready.clear()
            self.stuck = False
            self.planner.reset(self.ring.resume_cursor(version, cursor), skipped)
        return True

    def _floor(self) -> int:
        """The lowest cursor a rank wants: nothing before it is needed again."""
        return self.ring.resume_cursor(self.version, self.config_cursor)

    def _active_step(self) -> None:
        if not self._sync() or self.stuck:
            self.idle()
            return
        floor = self._floor()
        while self.ready and (
            self.ready[0].end <= floor or self.ring.find_slot(self.version, self.ready[0].start) is not None
        ):
            self.ready.popleft()
        if not self.ready and self.planner.cursor < floor:
            self.planner.reset(floor, self.skipped)
        slot = self.ring.free_slot(self.version)
        if slot is None:
            self.idle()
            return
        try:
            if self.ready:
                batch = self.ready.popleft()
            elif self.ring.find_slot(self.version, self.planner.cursor) is not None:
                self.planner.advance()  # the previous active loader left it in the ring
                return
            else:
                batch = self.planner.next()
        except DataError as exc:
            self.ring.set_error(self.version, self.planner.cursor, str(exc))
            self.stuck = True
            self.say(f"cannot assemble the batch at sample position {self.planner.cursor}: {exc}")
            return
        per_rank = list(zip(batch.source, batch.index, batch.rows, strict=True))
        self.ring.write_slot(slot, self.version, batch.start, batch.end, batch.positions, per_rank)
        self.ring.produced = batch.end
        self.worked()

    def _shadow_step(self) -> None:
        if not self._sync():
            self.idle()
            return
        floor = self._floor()
        while self.ready and self.ready[0].end <= floor:
            self.ready.popleft()
        if not self.ready and self.planner.cursor < floor:
            self.planner.reset(floor, self.skipped)
            self.stuck = False
        self.ring.set_warm(self.id, bool(self.ready) and self.ready[0].start == floor)
        if len(self.ready) < self.spec.shadow_prefetch and not self.stuck:
            try:
                self.ready.append(self.planner.next())
                self.worked()
            except DataError:
                self.stuck = True  # the active loader reports it when a rank gets that far
        else:
            self.idle()


def main(argv: list[str]) -> None:
    spec = LoaderSpec.from_json(argv[1])
    LoaderProcess(spec, int(argv[2])).run()


if __name__ == "__main__":
    main(sys.argv)
