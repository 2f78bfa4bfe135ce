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
import torch

from flows.curate import curate
from flows.services.build import build, load_pins
from flows.services.local_lakefs import LakeFSOnS3
from flows.services.toxiproxy import ToxiproxyServer
from flows.wap import LOCK_CANDIDATE_SUFFIX, MAIN, RUN_BRANCH_PREFIX
from formats.layout import PUBLISH_LOCK_BRANCH
from formats.shards import Manifest
from tests.flows.curate_support import params_for, write_corpus
from tests.training import test_streaming_lakefs as streaming
from tests.training.helpers import train_records
from training.synthetic import publish_synthetic_dataset
from training.trainer import train
from versioning import NotFound, RepoError
from versioning.lakefs import LakeFSRepo

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

OUTAGE_S = 30.0
healthy = streaming.healthy  # a local run's losses on the same synthetic dataset: the reference


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


@pytest.mark.parametrize("fault", list(EVENT_FAULTS))
def test_an_outage_in_the_middle_of_the_run(on_the_wire, corpus, tmp_path, reference, fault):
    during = EVENT_FAULTS[fault](on_the_wire)
    assert_one_of_the_two_outcomes(on_the_wire, corpus, tmp_path, reference, fault, during)


@pytest.mark.parametrize("seen", [ingest_committed, publishing], ids=["in-a-stage", "in-the-publish"])
def test_lakefs_killed_and_restarted_in_the_middle_of_the_run(on_the_wire, corpus, tmp_path, reference, seen):
    during = kill_lakefs(on_the_wire, seen)
    assert_one_of_the_two_outcomes(
        on_the_wire, corpus, tmp_path, reference, f"kill-9-lakefs-{seen.__name__.replace('_', '-')}", during
    )
    assert on_the_wire.stack.lakefs.process.running()


def test_training_streams_through_resets_and_latency_bit_exact(on_the_wire, healthy, tmp_path):
    _, reference_losses = healthy
    name = f"wire-train-{uuid.uuid4().hex[:8]}"
    repo = LakeFSRepo.from_lakectl(name)
    repo.ensure()
    commit = publish_synthetic_dataset(
        repo, "main", streaming.SOURCES, seq_len=32, vocab_size=256, total_samples=1200,
        shards_per_source=streaming.SHARDS_PER_SOURCE,
    )  # fmt: skip
    run = streaming.config("through-the-wire", tmp_path / "home", f"lakefs://{name}", commit)
    toxiproxy, api = on_the_wire.toxiproxy, on_the_wire.api
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the reference ran
    try:
        with (
            toxiproxy.toxic(api, "reset_peer", {"timeout": 0}, toxicity=0.2),
            toxiproxy.toxic(api, "latency", {"latency": 200, "jitter": 100}, name="latency"),
        ):
            train(run)
    finally:
        torch.set_num_threads(threads)
    assert [r["loss"] for r in train_records(run.run_dir())] == reference_losses  # bit for bit
    # The loader processes retry on their own (their WARNING lines are in the captured output).


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
