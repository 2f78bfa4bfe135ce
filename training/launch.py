"""How the trainer is launched: ``torchrun`` on one node (``--standalone``) or on several (c10d rendezvous).

One node is the default: ``torchrun --standalone --nproc-per-node N``. Past one node, every
node runs the same ``torchrun`` with ``--nnodes``, ``--rdzv-backend c10d``, one
``--rdzv-endpoint`` (``host:port`` of the node that hosts the rendezvous store) and one
``--rdzv-id``; torchrun's agents then agree on ranks and restart the workers of every node
together (``--max-restarts``) when one of them fails. A restarted worker resumes from the
newest valid checkpoint, like any restart (``training.trainer``).

Checkpoints and metrics are written by global rank 0 into the run directory, so on more
than one node that directory must be **shared storage** (NFS, a ReadWriteMany volume, a
parallel file system) mounted at the same path everywhere: a node that restarts, or that
becomes rank 0 after a restart, must see the newest checkpoint.

The train flow is the launcher of one node; the other nodes follow it
(``python -m training.launch follow``): each waits for the launch file the flow writes under
``<home>/launch/<rdzv id>.json`` (the same shared storage) and starts the same command. On
Kubernetes every pod runs ``python -m training.launch pod`` (``deploy/kubernetes``): pod 0 runs
the flow run, the others follow. This module never imports Prefect: it runs on nodes that have
no flow.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from versioning import data_home

_ENDPOINT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$")
_RDZV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class LaunchConfig(BaseModel):
    """The shape of a torchrun job: processes per node, nodes, rendezvous, elastic restarts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nproc_per_node: int = Field(default=1, ge=1, description="worker processes per node (one per GPU)")
    nnodes: int = Field(
        default=1, ge=1, description="nodes; past 1 the c10d rendezvous replaces --standalone"
    )
    rdzv_endpoint: str | None = Field(
        default=None,
        description="host:port of the rendezvous store (a node of the job); needed past one node",
    )
    rdzv_id: str | None = Field(
        default=None, description="the job's id, equal on every node; needed past one node"
    )
    max_restarts: int = Field(
        default=0, ge=0, description="times torchrun restarts the workers of every node after a failure"
    )
    rdzv_is_host: bool | None = Field(
        default=None,
        description="whether this node hosts the rendezvous store; None: torchrun decides from the endpoint's host",
    )

    @model_validator(mode="after")
    def _rendezvous_named(self) -> LaunchConfig:
        if self.rdzv_endpoint is not None and not _ENDPOINT.match(self.rdzv_endpoint):
            raise ValueError(
                f"rdzv_endpoint {self.rdzv_endpoint!r} must be host:port, e.g. trainer-0.train:29400"
            )
        if self.rdzv_id is not None and not _RDZV_ID.match(self.rdzv_id):
            raise ValueError(
                f"rdzv_id {self.rdzv_id!r} must be letters, digits, '.', '_' or '-' (at most 128)"
            )
        if self.nnodes > 1 and (self.rdzv_endpoint is None or self.rdzv_id is None):
            raise ValueError(
                f"nnodes={self.nnodes} needs rdzv_endpoint (host:port of one node) and rdzv_id (the same on "
                "every node)"
            )
        return self

    @property
    def standalone(self) -> bool:
        return self.nnodes == 1 and self.rdzv_endpoint is None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def environment(self) -> dict[str, str]:
        """Variables torchrun's agent needs beside its flags. Past one node the rendezvous store is
        not shared with the workers: with sharing, a node that replaces a failed one waits forever
        for the master address of the new round (pytorch/pytorch#135712), so a restarted pod could
        never rejoin."""
        return {} if self.standalone else {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def torchrun_args(self) -> list[str]:
        """torchrun's own flags (what comes before ``-m training``)."""
        common = [f"--nproc-per-node={self.nproc_per_node}", f"--max-restarts={self.max_restarts}"]
        if self.standalone:
            return ["--standalone", *common]
        args = [
            f"--nnodes={self.nnodes}", *common, "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.rdzv_endpoint}", f"--rdzv-id={self.rdzv_id}",
        ]  # fmt: skip
        if self.rdzv_is_host is not None:
            args.append(f"--rdzv-conf=is_host={str(self.rdzv_is_host).lower()}")
        return args


def torchrun_command(launch: LaunchConfig, config_path: Path) -> list[str]:
    """``python -m training.torchrun <flags> -m training --config <config_path>``: torchrun, which
    ends a job the workers refused with their sentence rather than its traceback (:mod:`training.torchrun`)."""
    return [
        sys.executable, "-m", "training.torchrun", *launch.torchrun_args(),
        "-m", "training", "--config", str(config_path),
    ]  # fmt: skip


def launch_file(home: Path, rdzv_id: str) -> Path:
    """Where the launching node leaves the job for the nodes that follow it."""
    return home / "launch" / f"{rdzv_id}.json"


def write_launch_file(home: Path, launch: LaunchConfig, config_path: Path) -> Path:
    """Publish the job (atomically) for :func:`follow`; the config file must be on shared storage too."""
    if launch.rdzv_id is None:
        raise ValueError("a launch file needs an rdzv_id")
    path = launch_file(home, launch.rdzv_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"launch": launch.model_dump(), "config": str(config_path)}))
    os.replace(tmp, path)
    return path


def follower_job(
    home: Path, rdzv_id: str, timeout_s: float, poll_s: float = 0.5
) -> tuple[LaunchConfig, Path]:
    """The job of a node that follows the launching one (as a client of its rendezvous store) and the
    config file to train with, read from the launch file; waits for it (the launching node may start later)."""
    path = launch_file(home, rdzv_id)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no launch file {path} after {timeout_s:.0f} s: the node running the train flow has not "
                "started the job, or does not share this storage"
            )
        time.sleep(poll_s)
    job = json.loads(path.read_text())
    launch = LaunchConfig.model_validate(job["launch"]).model_copy(update={"rdzv_is_host": False})
    return launch, Path(job["config"])


FLOW_FAILED_EXIT = 42  # pod 0's flow run failed: the Job's podFailurePolicy fails the whole job


def follow(home: Path, rdzv_id: str, timeout_s: float) -> None:
    """Become this node's torchrun (exec: its exit status is the node's)."""
    launch, config_path = follower_job(home.resolve(), rdzv_id, timeout_s)
    command = torchrun_command(launch, config_path)
    print("follow:", " ".join(command), flush=True)
    os.environ.update(launch.environment())
    os.execv(command[0], command)


def run_pod(args: argparse.Namespace) -> int:
    """A pod of the Kubernetes Indexed Job (``deploy/kubernetes``): export the job's shape as the
    ``TOKENLAKE_*`` variables the train flow reads, then pod 0 runs the flow run (the worker's
    command) and every other pod follows it."""
    shape = {
        "TOKENLAKE_NNODES": str(args.nnodes),
        "TOKENLAKE_NPROC_PER_NODE": str(args.nproc_per_node),
        "TOKENLAKE_RDZV_ENDPOINT": args.rdzv_endpoint,
        "TOKENLAKE_RDZV_ID": args.rdzv_id,
    }
    LaunchConfig(
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
    )  # a malformed template fails here, in one sentence, on every pod
    os.environ.update(shape)
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    if index > 0:
        follow(data_home(), args.rdzv_id, args.timeout)
    command = [c for c in args.flow_command if c != "--"]
    if not command:
        raise SystemExit("pod 0 needs the flow run's command after --")
    flow_run = subprocess.Popen(command)
    for signum in (signal.SIGTERM, signal.SIGINT):  # an eviction reaches the flow run (Prefect decides)
        signal.signal(signum, lambda received, _frame: flow_run.send_signal(received))
    status = flow_run.wait()
    return 0 if status == 0 else FLOW_FAILED_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.launch",
        description="the nodes of a multi-node job that the train flow launches",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    follower = commands.add_parser("follow", help="wait for the launch file, then run the same torchrun")
    follower.add_argument("--home", type=Path, default=data_home())
    follower.add_argument("--rdzv-id", default=os.environ.get("TOKENLAKE_RDZV_ID"))
    follower.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the launch file")
    pod = commands.add_parser(
        "pod", help="a pod of the Kubernetes job: pod 0 runs the flow, the others follow"
    )
    pod.add_argument("--nnodes", type=int, required=True)
    pod.add_argument("--nproc-per-node", type=int, required=True)
    pod.add_argument("--rdzv-endpoint", required=True)
    pod.add_argument("--rdzv-id", required=True)
    pod.add_argument("--timeout", type=float, default=3600.0, help="seconds a follower waits for pod 0")
    pod.add_argument("flow_command", nargs=argparse.REMAINDER, help="-- the flow run's command (pod 0)")
    args = parser.parse_args(argv)
    if args.command == "pod":
        return run_pod(args)
    if not args.rdzv_id:
        parser.error("--rdzv-id (or $TOKENLAKE_RDZV_ID) is required")
    follow(args.home, args.rdzv_id, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
