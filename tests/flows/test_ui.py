"""What a person sees in the Prefect UI after a curate run, checked on the API the UI reads.

A real `prefect server start` (its own database, UI included), `tokenlake serve` registering
deploy/prefect.yaml and running a worker, and a curate run triggered through the API as the
UI's Run button does. The run's page then has: log records at INFO (the stage lines, not
only Prefect's), the stage tasks, and the artifacts by key. Where Chromium is installed
(Debian's `chromium` package), a headless screenshot of the run's page goes to reports/;
without it that test is skipped, saying so (CI does not need a browser).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest

from formats.layout import STAGES
from tests.flows.curate_support import params_for, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a server, a worker and a run on a loaded machine

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
WAIT_LIMIT_S = 600  # waits end in a failure that shows the server's and serve's logs, never a hung suite


@dataclass(frozen=True)
class CurateRun:
    ui: str  # http://127.0.0.1:PORT
    flow_run_id: UUID
    state: str
    logs: list[tuple[int, str]]  # (level, message)
    task_runs: dict[str, str]  # task name -> state
    artifacts: dict[str, UUID]  # key -> id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ready, logs: list[Path]):
    give_up = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < give_up:
        if (found := ready()) is not None:
            return found
        time.sleep(1)
    raise AssertionError(f"{what} within {WAIT_LIMIT_S} s\n" + "\n".join(p.read_text()[-3000:] for p in logs))


def _healthy(url: str) -> bool | None:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=5) as response:
            return True if response.status == 200 else None
    except OSError:
        return None


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def curate_run(tmp_path_factory) -> Iterator[CurateRun]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    tmp = tmp_path_factory.mktemp("ui")
    ui = f"http://127.0.0.1:{_free_port()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "PREFECT_LOGGING"))}
    server_log, serve_log = tmp / "server.log", tmp / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", ui.rsplit(":", 1)[1]],
        env=base | {"PREFECT_HOME": str(tmp / "prefect"), "PREFECT_UI_API_URL": f"{ui}/api"},
        stdout=server_log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    serve = None
    try:
        _wait("the Prefect server did not answer", lambda: _healthy(ui), [server_log])
        env = base | {
            "PREFECT_API_URL": f"{ui}/api",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "TOKENLAKE_HOME": str(tmp / "home"),
            "TOKENLAKE_REPO": str(tmp / "repo"),
        }
        serve = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve"], env=env, cwd=ROOT,
            stdout=serve_log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        params = params_for(write_corpus(tmp / "sources"), str(tmp / "repo"), tmp / "results")
        with temporary_settings({PREFECT_API_URL: f"{ui}/api"}), get_client(sync_client=True) as client:

            def deployment():
                try:
                    return client.read_deployment_by_name("curate/curate-nightly").id
                except ObjectNotFound:
                    return None

            deployment_id = _wait("tokenlake serve did not register curate-nightly", deployment, [serve_log])
            run = client.create_flow_run_from_deployment(
                deployment_id, parameters={"params": params.model_dump(mode="json")}
            )

            def finished():
                state = client.read_flow_run(run.id).state
                return state if state and state.is_final() else None

            state = _wait("the curate run did not finish", finished, [serve_log, server_log])

            def logged():  # the run's log records arrive in batches, the last after its final state
                logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                return (
                    logs
                    if any("curate: published" in r.message for r in logs) or not state.is_completed()
                    else None
                )

            logs = _wait("the run's log never said what it published", logged, [serve_log])
            task_runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
            )
            artifacts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
            )
        yield CurateRun(
            ui=ui,
            flow_run_id=run.id,
            state=state.name,
            logs=[(r.level, r.message) for r in logs],
            task_runs={r.name.rsplit("-", 1)[0]: r.state.name for r in task_runs if r.state},
            artifacts={a.key: a.id for a in artifacts if a.key},
        )
    finally:
        if serve is not None:
            _stop(serve)
        _stop(server)


def test_the_run_page_has_info_logs_stage_tasks_and_keyed_artifacts(curate_run: CurateRun):
    assert curate_run.state == "Completed", curate_run.logs[-5:]
    info = [message for level, message in curate_run.logs if level == 20]
    for stage in STAGES:
        assert any(m.startswith(f"{stage}: gate ") and "commit" in m for m in info), (
            f"no INFO line of {stage}"
        )
    assert any(m.startswith("ingest: prose: read ") and "quarantined" in m for m in info), "per-source counts"
    assert any(m.startswith("curate: published ds-") for m in info), "what was published"
    assert curate_run.task_runs == dict.fromkeys(["open-run-branch", *STAGES, "publish"], "Completed")
    assert {"curate-summary", "curate-stages", "curate-funnel", "curate-progress", "shard-progress"} | {
        f"{stage}-stage" for stage in STAGES
    } <= set(curate_run.artifacts)


def _screenshot(page: str, shot: Path, width: int) -> None:
    shot.parent.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    browser = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},1200", "--virtual-time-budget=20000", f"--screenshot={shot}", page],
        capture_output=True, text=True,
    )  # fmt: skip
    assert browser.returncode == 0 and shot.is_file(), browser.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000, (
        "a page, not a blank"
    )


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (Debian package `chromium`)")
def test_screenshots_of_the_run_page_and_its_stages_table(curate_run: CurateRun):
    """For a person to look at (reports/): the run page, and the stages table at 1600 px."""
    _screenshot(
        f"{curate_run.ui}/runs/flow-run/{curate_run.flow_run_id}",
        ROOT / "reports" / "ui-curate-flow-run.png",
        1440,
    )
    stages = curate_run.artifacts["curate-stages"]
    _screenshot(
        f"{curate_run.ui}/artifacts/artifact/{stages}", ROOT / "reports" / "ui-curate-stages.png", 1600
    )
