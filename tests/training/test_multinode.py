"""Two torchrun launchers as two "nodes" on 127.0.0.1 (gloo, one process each, c10d rendezvous):
the same losses and weights as one node running two processes, and a node killed mid-run.

The ranks run on the CPU wherever this machine has fewer CUDA devices than the two ranks
(a warning says so), as in test_distributed.py."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from tests.training.helpers import (
    ROOT,
    children,
    device_for_ranks,
    final_weights,
    make_dataset,
    newest_durable_step,
    torchrun,
    train_records,
)
from tests.training.helpers import make_config as make_job_config
from training.checkpoint import COMPLETE, step_dir_name
from training.config import TrainConfig
from training.launch import LaunchConfig, torchrun_command, write_launch_file
from training.metrics import read_metrics

pytestmark = pytest.mark.slow
DEVICE, FALLBACK = device_for_ranks(2)


def make_config(ds, run, **fields):
    return make_job_config(ds, run, device=DEVICE, deterministic=DEVICE != "cpu", **fields)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    if FALLBACK:
        warnings.warn(f"tests/training/test_multinode.py: {FALLBACK}", stacklevel=1)
    return make_dataset(tmp_path_factory.mktemp("multinode"))


@pytest.fixture(scope="module")
def one_node(dataset):
    """The reference: one node, two processes, uninterrupted."""
    config = make_config(dataset, "one-node")
    result = torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-4000:]
    return config


def free_port() -> int:
    """A free port below the kernel's ephemeral range, so no outgoing connection of another
    process is handed it between this check and torchrun binding it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    while True:
        port = rng.randrange(max(1024, low - 8000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


# torchrun picks each round's master port by binding port 0 and closing it again (the store
# is not shared: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 lets a node rejoin), so on a loaded
# machine another process can take that port before the workers bind it. That round then
# fails in init_process_group, before any step or resume record; a spare restart absorbs it,
# and the assertions below (resume points, bit-exact losses) hold however many rounds ran.
SPARE_RESTARTS = 2


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class TwoNodes:
    """Node 0 launches the job the way the train flow does (it hosts the rendezvous and writes
    the launch file); node 1 follows it with ``python -m training.launch follow``, as the
    other pods of the Kubernetes job do."""

    def __init__(self, config: TrainConfig, max_restarts: int = 0):
        self.config = config
        self.home = config.home_dir()
        self.launch = LaunchConfig(
            nnodes=2, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_id=f"job-{config.run}",
            max_restarts=max_restarts + SPARE_RESTARTS, rdzv_is_host=True,
        )  # fmt: skip
        self.logs = config.run_dir().parent / f"{config.run}-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        config_path = config.run_dir().parent / f"{config.run}.config.json"
        config_path.write_text(config.model_dump_json())
        write_launch_file(self.home, self.launch, config_path)
        self.node0 = self._start(
            torchrun_command(self.launch, config_path), "node0", self.launch.environment()
        )
        self.node1 = self.start_follower()

    def _start(self, command: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.logs / f"{name}-{time.monotonic_ns()}.log").open("w")
        return subprocess.Popen(
            command, cwd=ROOT, env={**_env(), **(env or {})}, stdout=log, stderr=subprocess.STDOUT
        )

    def start_follower(self) -> subprocess.Popen:
        command = [
            sys.executable, "-m", "training.launch", "follow", "--home", str(self.home),
            "--rdzv-id", str(self.launch.rdzv_id), "--timeout", "60",
        ]  # fmt: skip
        return self._start(command, "node1")

    def wait(self) -> tuple[int, int]:
        return self.node0.wait(timeout=600), self.node1.wait(timeout=600)

    def output(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.logs.iterdir()))


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has finished)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def wait_until(condition, what: str, proc: subprocess.Popen, deadline_s: float = 300) -> None:
    """Poll for an event; give up only if the job it depends on exited (or far past any normal run)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"node exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def resumes(config: TrainConfig) -> list[tuple[int, int]]:
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    return [(r["step"], r["world_size"]) for r in records if r["kind"] == "resume"]


def assert_same_training(run: TrainConfig, reference: TrainConfig) -> None:
    """Every logged loss (replays included) and the final weights bit-equal to the reference's."""
    expected = {r["step"]: r["loss"] for r in train_records(reference.run_dir())}
    seen = train_records(run.run_dir())
    assert {r["step"] for r in seen} == set(expected)
    assert all(r["loss"] == expected[r["step"]] for r in seen)
    ours, theirs = (
        final_weights(run.run_dir(), run.steps),
        final_weights(reference.run_dir(), reference.steps),
    )
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def mid_run(config: TrainConfig) -> bool:
    """Step 10 logged and the step-8 checkpoint durable (the kills below land after both)."""
    metrics = config.run_dir() / "metrics.jsonl"
    marker = config.run_dir() / "checkpoints" / step_dir_name(8) / COMPLETE
    return (
        metrics.exists() and marker.exists() and any(r["step"] >= 10 for r in train_records(config.run_dir()))
    )


def test_two_nodes_train_exactly_like_one_node_with_two_processes(dataset, one_node):
    config = make_config(dataset, "two-nodes")
    job = TwoNodes(config)
    assert job.wait() == (0, 0), job.output()
    assert resumes(config) == [(0, 2)]  # one world of two ranks, formed across the two launchers
    assert_same_training(config, one_node)


def test_a_killed_node_rejoins_and_the_job_resumes_through_max_restarts(dataset, one_node):
    config = make_config(dataset, "node-killed")
    job = TwoNodes(config, max_restarts=1)
    wait_until(lambda: mid_run(config), "step 10 and a durable step-8 checkpoint", job.node0)
    node0_workers = children(job.node0.pid)
    for pid in [*children(job.node1.pid), job.node1.pid]:  # node 1: its launcher and its worker
        os.kill(pid, signal.SIGKILL)
    assert job.node1.wait(timeout=60) == -signal.SIGKILL
    # node 0's worker fails at its next collective; its launcher stays, waiting for a new round
    wait_until(lambda: not any(alive(p) for p in node0_workers), "node 0's worker to fail", job.node0)
    durable = newest_durable_step(config)  # nothing writes checkpoints until the job restarts
    assert durable is not None and durable >= 8
    logged = max(r["step"] for r in train_records(config.run_dir()))

    job.node1 = job.start_follower()  # what Kubernetes does with the pod of a failed index
    assert job.wait() == (0, 0), job.output()
    # the same launcher of node 0 ran to the end: torchrun restarted the workers of both nodes,
    # which resumed from the newest checkpoint that was durable when the node died
    assert resumes(config) == [(0, 2), (durable, 2)]
    assert_same_training(config, one_node)
    # the steps logged after that checkpoint ran again (how many depends on when the kill landed)
    assert len(train_records(config.run_dir())) == config.steps + logged - durable


def test_killing_the_rendezvous_host_fails_the_job_and_a_relaunch_resumes_exactly(dataset, one_node):
    """The node hosting the c10d store dies: the other cannot go on, so the job fails as a whole
    (as the train flow's attempt would), and launching both again resumes from the newest
    durable checkpoint, as the flow's retry does."""
    config = make_config(dataset, "host-killed")
    job = TwoNodes(config, max_restarts=1)
    wait_until(lambda: mid_run(config), "step 10 and a durable step-8 checkpoint", job.node0)
    for pid in [*children(job.node0.pid), job.node0.pid]:
        os.kill(pid, signal.SIGKILL)
    assert job.node0.wait(timeout=60) == -signal.SIGKILL
    assert job.node1.wait(timeout=600) != 0  # the follower's torchrun gives up: no store to rejoin
    durable = newest_durable_step(config)
    assert durable is not None and durable >= 8

    again = TwoNodes(config, max_restarts=1)  # the retry: the flow launches again, the follower follows
    assert again.wait() == (0, 0), again.output()
    assert resumes(config) == [(0, 2), (durable, 2)]
    assert_same_training(config, one_node)
