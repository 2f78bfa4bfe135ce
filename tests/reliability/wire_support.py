"""Curate runs under faults on the wire (toxiproxy in front of a real lakeFS and of its MinIO), and
what each run's outcome was: shared by ``tests/reliability/test_wire_faults.py`` (one fault each)
and ``benchmarks/chaos/wire_faults.py`` (the long campaign).

An outcome is one of two, or a failure of the product: the run published content byte-identical to
a fault-free run's (every shard's name and sha256, the totals), or it failed with one sentence
naming lakeFS, ``main`` holds no dataset, and a re-run without the fault published the identical
content.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from flows.curate import curate
from flows.services.build import build, load_pins
from flows.services.local_lakefs import LakeFSOnS3
from flows.services.toxiproxy import ToxiproxyServer
from flows.wap import LOCK_CANDIDATE_SUFFIX, MAIN, RUN_BRANCH_PREFIX
from formats.layout import PUBLISH_LOCK_BRANCH
from formats.shards import Manifest
from tests.flows.curate_support import params_for
from versioning import NotFound, RepoError
from versioning.lakefs import LakeFSRepo

OUTAGE_S = 30.0


class Wire:
    """The services, the proxies and a direct (fault-free) way to look at lakeFS."""

    def __init__(self, workdir: Path):
        pins = load_pins()
        for name in ("toxiproxy", "minio", "lakefs"):
            build(pins[name], say=lambda line: None)
        self.toxiproxy = ToxiproxyServer(workdir / "toxiproxy").start()
        try:
            self.stack = LakeFSOnS3(workdir / "stack", toxiproxy=self.toxiproxy).start()
        except BaseException:
            self.toxiproxy.stop()
            raise
        self.api, self.s3 = self.stack.lakefs_proxy, self.stack.s3_proxy

    def direct(self, repository: str) -> LakeFSRepo:
        """The repository as seen straight from lakeFS, past the proxy."""
        credentials = self.stack.lakefs.credentials
        return LakeFSRepo.connect(
            credentials.endpoint, credentials.access_key_id, credentials.secret_access_key, repository
        )

    def stop(self) -> None:
        try:
            self.stack.stop()
        finally:
            self.toxiproxy.stop()


def published(repo: LakeFSRepo, ref: str) -> tuple:
    """What must be byte-identical between runs: every shard's name and sha256, and the totals."""
    manifest = Manifest.model_validate_json(repo.get(ref, "shards/manifest.json"))
    return [(s.name, s.sha256) for s in manifest.shards], manifest.totals


@contextmanager
def counted_retries() -> Iterator[list[logging.LogRecord]]:
    """The adapter's retry warnings while the block runs."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retry" in record.getMessage():
                records.append(record)

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("versioning.lakefs")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


class Trigger:
    """Calls ``act`` once ``seen(repo, branches)`` holds for ``repository``, looked at past the
    proxy (an event in the run, so the fault lands where it is meant to); ``fired`` says it did."""

    def __init__(self, wire: Wire, repository: str, seen, act: Callable[[], None]):
        self.fired = threading.Event()
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(wire, repository, seen, act), daemon=True)
        self._thread.start()

    def _watch(self, wire: Wire, repository: str, seen, act: Callable[[], None]) -> None:
        probe = wire.direct(repository)
        while not self.stop.is_set():
            try:
                if seen(probe, probe.list_branches()):
                    self.fired.set()
                    act()
                    return
            except (NotFound, RepoError):
                pass  # the repository or its run branch is not there yet
            self.stop.wait(0.01)

    def __enter__(self) -> Trigger:
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._thread.join()
        assert self.fired.is_set(), "the fault never fired: the run ended before its event"


def ingest_committed(probe: LakeFSRepo, branches: dict[str, str]) -> bool:
    return any(
        branch.startswith(RUN_BRANCH_PREFIX) and probe.get_commit(head).metadata.get("stage") == "ingest"
        for branch, head in branches.items()
    )


def publishing(probe: LakeFSRepo, branches: dict[str, str]) -> bool:
    """The publish is taking its lock: the merge into main comes next."""
    return PUBLISH_LOCK_BRANCH in branches or any(b.endswith(LOCK_CANDIDATE_SUFFIX) for b in branches)


def toxic(kind: str, attributes: dict, *, proxy: str = "api", **options) -> Callable[[Wire], Callable]:
    def during(wire: Wire) -> Callable[[str], AbstractContextManager]:
        return lambda name: wire.toxiproxy.toxic(getattr(wire, proxy), kind, attributes, **options)

    return during


STEADY_FAULTS = {
    "latency-200ms": toxic("latency", {"latency": 200, "jitter": 100}),
    "resets-5pct": toxic("reset_peer", {"timeout": 0}, toxicity=0.05),
    "resets-20pct": toxic("reset_peer", {"timeout": 0}, toxicity=0.20),
    "bandwidth-256kbps": toxic("bandwidth", {"rate": 256}),
    "s3-latency-200ms": toxic("latency", {"latency": 200, "jitter": 100}, proxy="s3"),
}


def outage(wire: Wire, seen, length_s: float = OUTAGE_S):
    """The lakeFS proxy cut for ``length_s`` once ``seen`` holds (the fault's length, not a wait);
    healed early if the run ends inside it."""

    def during(name: str) -> Trigger:
        def cut() -> None:
            wire.toxiproxy.set_enabled(wire.api, False)
            trigger.stop.wait(length_s)
            wire.toxiproxy.set_enabled(wire.api, True)

        trigger = Trigger(wire, name, seen, cut)
        return trigger

    return during


def kill_lakefs(wire: Wire, seen):
    lakefs = wire.stack.lakefs

    def kill_and_restart() -> None:
        lakefs.kill()
        lakefs.restart()

    return lambda name: Trigger(wire, name, seen, kill_and_restart)


EVENT_FAULTS = {
    "outage-30s-in-a-stage": lambda wire: outage(wire, ingest_committed),
    "outage-30s-in-the-publish": lambda wire: outage(wire, publishing),
}


EVENT_FAULTS = {
    "outage-30s-in-a-stage": lambda wire: outage(wire, ingest_committed),
    "outage-30s-in-the-publish": lambda wire: outage(wire, publishing),
    "kill-9-lakefs-in-a-stage": lambda wire: kill_lakefs(wire, ingest_committed),
    "kill-9-lakefs-in-the-publish": lambda wire: kill_lakefs(wire, publishing),
}
FAULTS = STEADY_FAULTS | EVENT_FAULTS


@dataclass
class Outcome:
    fault: str
    state: str  # the faulted run's final state
    retries: int  # the adapter's retries in that run
    message: str  # the failed run's message ("" when it completed)
    identical: bool  # what it (or the re-run after its failure) published equals the reference
    main_untouched: bool  # a failed run left no dataset on main
    one_sentence: bool  # a failed run's message is one line naming lakeFS

    @property
    def acceptable(self) -> bool:
        if self.state == "Completed":
            return self.identical
        return self.identical and self.main_untouched and self.one_sentence


def run_under_fault(
    wire: Wire, corpus: dict[str, Path], workdir: Path, reference: tuple, fault: str
) -> Outcome:
    """One curate run on a fresh repository while ``fault`` is on the wire, and a re-run if it failed."""
    name = f"wire-{fault}-{uuid.uuid4().hex[:8]}"
    params = params_for(corpus, f"lakefs://{name}", workdir / "results")
    during = FAULTS[fault](wire)
    with counted_retries() as retries, during(name):
        state = curate(params, return_state=True)
    wire.toxiproxy.reset()
    direct = wire.direct(name)
    if state.is_completed():
        return Outcome(
            fault,
            state.name,
            len(retries),
            "",
            published(direct, state.result().tag) == reference,
            True,
            True,
        )
    message = (state.message or "").strip()
    try:
        untouched = not direct.exists(MAIN, "shards/manifest.json")
    except NotFound:
        untouched = True  # the repository itself was never made
    again = curate(params)
    return Outcome(
        fault, state.name, len(retries), message, published(direct, again.tag) == reference, untouched,
        "lakeFS" in message and "\n" not in message,
    )  # fmt: skip


def reference_run(wire: Wire, corpus: dict[str, Path], workdir: Path) -> tuple:
    """A fault-free run's published content."""
    name = f"wire-reference-{uuid.uuid4().hex[:8]}"
    version = curate(params_for(corpus, f"lakefs://{name}", workdir / "results"))
    return published(wire.direct(name), version.tag)
