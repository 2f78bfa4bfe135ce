"""``tokenlake serve``: the deployments of ``deploy/prefect.yaml``, through Prefect's own machinery.

No loader of our own reads the file: ``prefect deploy --all`` registers every deployment as
written (work pool, pull steps, every kind of schedule, parameters), and ``prefect worker
start`` runs the flow runs of each process work pool, as ``deploy/compose.yaml`` does with a
server of its own. ``tokenlake serve`` only adds what a single machine needs: the process
pools the file names are created when missing, ``TOKENLAKE_ROOT`` (the pull step's working
directory) is this project, and one worker per process pool runs in the foreground. A pool
of another type (Kubernetes) is registered but needs its worker where that infrastructure is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from flows.served_workers import STOP_TIMEOUT_S, ServedWorkers


class ServeError(ValueError):
    """``tokenlake serve`` cannot start; the message says what to set or fix."""


def work_pools(prefect_yaml: Path) -> dict[str, str]:
    """{deployment name: its work pool's name}; a deployment without one is refused, since
    `prefect deploy` would ask for it interactively."""
    try:
        spec = yaml.safe_load(Path(prefect_yaml).read_text()) or {}
    except FileNotFoundError:
        raise ServeError(f"{prefect_yaml} does not exist") from None
    pools = {}
    for entry in spec.get("deployments") or []:
        pool = (entry.get("work_pool") or {}).get("name")
        if not pool:
            raise ServeError(
                f"{prefect_yaml}: deployment {entry.get('name')!r} names no work_pool; add `work_pool: {{name: ...}}`"
            )
        pools[entry["name"]] = pool
    if not pools:
        raise ServeError(f"{prefect_yaml} declares no deployments")
    return pools


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ServeError(
            "tokenlake serve needs a Prefect server: start one (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    return url


def ensure_process_pools(names: set[str]) -> dict[str, str]:
    """{pool: type}, creating each missing pool as a process pool."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    types = {}
    with get_client(sync_client=True) as client:
        for name in sorted(names):
            try:
                types[name] = client.read_work_pool(name).type
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process"))
                types[name] = "process"
    return types


def _environment(root: Path) -> dict[str, str]:
    return os.environ | {"TOKENLAKE_ROOT": str(root), "PREFECT_API_URL": api_url()}


def deploy_all(prefect_yaml: Path, root: Path) -> list[str]:
    """Register every deployment of ``prefect_yaml`` (``prefect deploy --all``); returns the
    process pools to run workers for."""
    pools = work_pools(prefect_yaml)
    types = ensure_process_pools(set(pools.values()))
    deploy = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_yaml)],
        cwd=root, env=_environment(root), capture_output=True, text=True,
    )  # fmt: skip
    if deploy.returncode != 0:
        raise ServeError(
            f"prefect deploy failed ({deploy.returncode}):\n{(deploy.stdout + deploy.stderr).strip()[-3000:]}"
        )
    for name, kind in sorted(types.items()):
        if kind != "process":
            print(f"tokenlake serve: pool {name} is a {kind} pool: run its worker where that infrastructure is "
                  f"(prefect worker start --pool {name})", file=sys.stderr)  # fmt: skip
    return [name for name, kind in sorted(types.items()) if kind == "process"]


def start_worker(pools: list[str], root: Path, stop_timeout: float = STOP_TIMEOUT_S) -> int:
    """One ``prefect worker start --pool P`` per pool, in the foreground until they exit or a
    signal stops them (:mod:`flows.served_workers`: a bounded stop)."""
    if not pools:
        raise ServeError("no process work pool to run a worker for")
    workers: list[subprocess.Popen[Any]] = [
        subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool],
            cwd=root,
            env=_environment(root),
            start_new_session=True,
        )
        for pool in pools
    ]
    return ServedWorkers(workers, stop_timeout).wait()
