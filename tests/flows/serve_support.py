"""`tokenlake serve` in a subprocess against the test's Prefect API, and waits on what it runs.

Waits end in a failure that shows the serve log, never in a hung suite."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

WAIT_LIMIT_S = 300


def start_serve(prefect_yaml: Path, home: Path, *args: str) -> subprocess.Popen:
    """``tokenlake serve --prefect-yaml prefect_yaml ARGS``, its output in ``home/serve.log``."""
    home.mkdir(parents=True, exist_ok=True)
    env = os.environ | {
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "TOKENLAKE_HOME": str(home / "home"),
        "TOKENLAKE_REPO": str(home / "repo"),
    }
    with (home / "serve.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", "--prefect-yaml", str(prefect_yaml), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def serve_log(home: Path) -> str:
    return (home / "serve.log").read_text()


def deployment_id(name: str, process: subprocess.Popen, home: Path) -> UUID:
    """The deployment once `serve` has registered it (its worker then polls for its runs)."""
    give_up = time.monotonic() + WAIT_LIMIT_S
    with get_client(sync_client=True) as client:
        while process.poll() is None and time.monotonic() < give_up:
            try:
                return client.read_deployment_by_name(name).id
            except ObjectNotFound:
                time.sleep(0.5)
    state = f"exited ({process.returncode})" if process.poll() is not None else f"never registered {name!r}"
    raise AssertionError(f"tokenlake serve {state}:\n{serve_log(home)}")


def final_state(flow_run_id: UUID, not_before_run: int = 1):
    give_up = time.monotonic() + WAIT_LIMIT_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < give_up:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final() and run.run_count >= not_before_run:
                return run.state
            time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} did not finish within {WAIT_LIMIT_S} s")
