"""Curate on a real lakeFS with faults on the wire (toxiproxy), one fault each.

toxiproxy sits between tokenlake and lakeFS (proxy ``lakefs``) and between lakeFS and its S3 store,
MinIO (proxy ``s3``); lakeFS v1.84.0 and MinIO are real processes (``flows/services``). Each test
runs the curate flow on a fresh repository under one fault, and the outcome must be one of two:

* the run publishes content byte-identical to a fault-free run's (the same shards, by sha256,
  and the same totals);
* or it fails with a sentence that names lakeFS, ``main`` holds no dataset, and a re-run without
  the fault publishes the identical content.

The retries the adapter spent are counted from its WARNING lines and printed. The long
campaigns (more rounds, more faults) are ``benchmarks/chaos/``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from flows.curate import curate
from flows.services.build import build, load_pins
from flows.services.local_lakefs import LakeFSOnS3
from flows.services.toxiproxy import ToxiproxyServer
from flows.wap import MAIN, RUN_BRANCH_PREFIX
from formats.shards import Manifest
from tests.flows.curate_support import params_for, write_corpus
from versioning import NotFound, RepoError
from versioning.lakefs import LakeFSRepo

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

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


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    workdir = Path(tempfile.mkdtemp(prefix="tokenlake-wire-"))
    wire = Wire(workdir)
    try:
        yield wire
    finally:
        wire.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def on_the_wire(wire: Wire, monkeypatch, tmp_path) -> Wire:
    for name, value in wire.stack.lakectl_environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(tmp_path / "no-lakectl.yaml"))
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    wire.toxiproxy.reset()
    yield wire
    wire.toxiproxy.reset()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("wire-corpus"))


def published(repo: LakeFSRepo, ref: str) -> tuple:
    """What must be byte-identical between runs: every shard's name and sha256, and the totals."""
    manifest = Manifest.model_validate_json(repo.get(ref, "shards/manifest.json"))
    return [(s.name, s.sha256) for s in manifest.shards], manifest.totals


@pytest.fixture(scope="module")
def reference(wire: Wire, corpus, tmp_path_factory) -> tuple:
    """A fault-free run's published content."""
    home = tmp_path_factory.mktemp("wire-reference")
    name = f"wire-reference-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in wire.stack.lakectl_environment().items():
            patch.setenv(key, value)
        patch.setenv("LAKECTL_CONFIG_FILE", str(home / "no-lakectl.yaml"))
        patch.setenv("TOKENLAKE_HOME", str(home / "home"))
        version = curate(params_for(corpus, f"lakefs://{name}", home / "results"))
    return published(wire.direct(name), version.tag)


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


def once_a_stage_committed(
    wire: Wire, repository: str, stage: str, act: Callable[[], None]
) -> threading.Thread:
    """A thread that calls ``act`` once the run branch of ``repository`` holds ``stage``'s commit
    (an event, looked at past the proxy, so the fault lands in the middle of the run)."""

    def watch() -> None:
        probe = wire.direct(repository)
        while True:
            try:
                for branch, head in probe.list_branches().items():
                    if (
                        branch.startswith(RUN_BRANCH_PREFIX)
                        and probe.get_commit(head).metadata.get("stage") == stage
                    ):
                        act()
                        return
            except (NotFound, RepoError):
                pass  # the repository or its run branch is not there yet
            threading.Event().wait(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def assert_one_of_the_two_outcomes(wire: Wire, corpus, tmp_path, reference, fault: str, during) -> None:
    name = f"wire-{fault}-{uuid.uuid4().hex[:8]}"
    params = params_for(corpus, f"lakefs://{name}", tmp_path / "results")
    with counted_retries() as retries, during(name):
        state = curate(params, return_state=True)
    print(f"\n{fault}: {state.name} after {len(retries)} adapter retries")
    wire.toxiproxy.reset()
    direct = wire.direct(name)
    if state.is_completed():
        assert published(direct, state.result().tag) == reference
        return
    assert "lakeFS" in state.message, state.message
    assert "\n" not in state.message.strip(), state.message
    try:
        assert not direct.exists(MAIN, "shards/manifest.json"), "a failed run left a dataset on main"
    except NotFound:
        pass  # the repository itself was never made
    again = curate(params)
    assert published(direct, again.tag) == reference


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


@pytest.mark.parametrize("fault", list(STEADY_FAULTS))
def test_a_steady_fault_on_the_wire(on_the_wire, corpus, tmp_path, reference, fault):
    assert_one_of_the_two_outcomes(
        on_the_wire, corpus, tmp_path, reference, fault, STEADY_FAULTS[fault](on_the_wire)
    )


def test_an_outage_in_the_middle_of_a_stage(on_the_wire, corpus, tmp_path, reference):
    wire = on_the_wire
    healed = threading.Event()

    @contextmanager
    def outage_after_ingest(name: str):
        def cut() -> None:
            wire.toxiproxy.set_enabled(wire.api, False)
            healed.wait(OUTAGE_S)  # the fault's length, not a wait for the system
            wire.toxiproxy.set_enabled(wire.api, True)

        watcher = once_a_stage_committed(wire, name, "ingest", cut)
        try:
            yield
        finally:
            healed.set()
            watcher.join()

    assert_one_of_the_two_outcomes(wire, corpus, tmp_path, reference, "outage-30s", outage_after_ingest)


def test_lakefs_killed_in_the_middle_of_a_stage_and_restarted(on_the_wire, corpus, tmp_path, reference):
    wire = on_the_wire
    lakefs = wire.stack.lakefs

    @contextmanager
    def kill_after_ingest(name: str):
        def kill_and_restart() -> None:
            lakefs.kill()
            lakefs.restart()

        watcher = once_a_stage_committed(wire, name, "ingest", kill_and_restart)
        try:
            yield
        finally:
            watcher.join()

    assert_one_of_the_two_outcomes(wire, corpus, tmp_path, reference, "kill-9-lakefs", kill_after_ingest)
    assert lakefs.process.running()


def test_the_faults_reach_the_wire(on_the_wire):
    """The proxies are really in the path: with the lakeFS proxy off, the adapter cannot reach lakeFS."""
    wire = on_the_wire
    through_proxy = LakeFSRepo.from_lakectl(f"wire-probe-{uuid.uuid4().hex[:8]}")
    wire.toxiproxy.set_enabled(wire.api, False)
    with pytest.raises(RepoError, match="lakeFS"):
        through_proxy.ensure()
    wire.toxiproxy.set_enabled(wire.api, True)
    through_proxy.ensure()
    assert wire.direct(through_proxy.name).resolve(MAIN) == through_proxy.resolve(MAIN)
