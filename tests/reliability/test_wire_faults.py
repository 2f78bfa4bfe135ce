"""Curate on a real lakeFS with faults on the wire (toxiproxy), one fault each.

toxiproxy sits between tokenlake and lakeFS (proxy ``lakefs``) and between lakeFS and its S3 store,
MinIO (proxy ``s3``); lakeFS v1.84.0 and MinIO are real processes (``flows/services``). Each test
runs the curate flow on a fresh repository under one fault (``tests/reliability/wire_support.py``),
and the outcome must be one of two:

* the run publishes content byte-identical to a fault-free run's (the same shards, by sha256,
  and the same totals);
* or it fails with a sentence that names lakeFS, ``main`` holds no dataset, and a re-run without
  the fault publishes the identical content.

The retries the adapter spent are printed. The long campaign (rounds of every fault) is
``benchmarks/chaos/wire_faults.py``.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flows.wap import MAIN
from tests.flows.curate_support import write_corpus
from tests.reliability.wire_support import FAULTS, Wire, reference_run, run_under_fault
from tests.training import test_streaming_lakefs as streaming
from tests.training.helpers import train_records
from training.synthetic import publish_synthetic_dataset
from training.trainer import train
from versioning import RepoError
from versioning.lakefs import LakeFSRepo

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

healthy = streaming.healthy  # a local run's losses on the same synthetic dataset: the reference


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    workdir = Path(tempfile.mkdtemp(prefix="tokenlake-wire-"))
    wire = Wire(workdir)
    try:
        yield wire
    finally:
        wire.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def on_the_wire(wire: Wire, tmp_path_factory) -> Iterator[Wire]:
    home = tmp_path_factory.mktemp("wire-home")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in wire.stack.lakectl_environment().items():
            patch.setenv(name, value)
        patch.setenv("LAKECTL_CONFIG_FILE", str(home / "no-lakectl.yaml"))
        patch.setenv("TOKENLAKE_HOME", str(home / "home"))
        yield wire


@pytest.fixture(autouse=True)
def no_fault_left(request):
    yield
    if "on_the_wire" in request.fixturenames:
        request.getfixturevalue("on_the_wire").toxiproxy.reset()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("wire-corpus"))


@pytest.fixture(scope="module")
def reference(on_the_wire: Wire, corpus, tmp_path_factory) -> tuple:
    return reference_run(on_the_wire, corpus, tmp_path_factory.mktemp("wire-reference"))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_one_fault_on_the_wire(on_the_wire, corpus, tmp_path, reference, fault):
    outcome = run_under_fault(on_the_wire, corpus, tmp_path, reference, fault)
    print(f"\n{fault}: {outcome.state} after {outcome.retries} adapter retries {outcome.message[:160]}")
    assert outcome.identical, outcome
    if outcome.state != "Completed":
        assert outcome.main_untouched and outcome.one_sentence, outcome
    if fault.startswith("kill-9-lakefs"):
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
