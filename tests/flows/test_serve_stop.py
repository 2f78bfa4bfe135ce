"""Stopping `tokenlake serve` ends in a bounded time and accounts for every run in flight.

A run of a flow that holds until the test releases it is in flight when `tokenlake serve`
gets SIGTERM. Given time (`--stop-timeout`), the run finishes and is Completed; given none,
its process is ended and the run is marked Crashed, never left Running. Either way `serve`
exits on its own and no flow-run process is left behind.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
from prefect.client.orchestration import get_client

from tests.flows.serve_support import WAIT_LIMIT_S, deployment_id, final_state, serve_log, start_serve

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(900)]

PREFECT_YAML = """\
name: serve-stop-test
prefect-version: 3.9.1
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{ $TOKENLAKE_ROOT }}"
deployments:
  - name: held
    entrypoint: tests/flows/held_flow.py:held
    work_pool: {name: serve-stop-test}
"""


def _wait_for(path: Path, serve, home: Path) -> None:
    give_up = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        assert serve.poll() is None and time.monotonic() < give_up, f"no {path.name}:\n{serve_log(home)}"
        time.sleep(0.2)


def _exited(serve, home: Path) -> int:
    try:
        return serve.wait(timeout=WAIT_LIMIT_S)
    except Exception:
        serve.kill()
        raise AssertionError(f"tokenlake serve did not stop:\n{serve_log(home)}") from None


def _held_run(tmp_path: Path, stop_timeout: str):
    prefect_yaml = tmp_path / "prefect.yaml"
    prefect_yaml.write_text(PREFECT_YAML)
    markers = tmp_path / "markers"
    markers.mkdir()
    serve = start_serve(prefect_yaml, tmp_path, "--stop-timeout", stop_timeout)
    held = deployment_id("held/held", serve, tmp_path)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(held, parameters={"marker_dir": str(markers)})
    _wait_for(markers / "started", serve, tmp_path)
    return serve, run.id, markers, int((markers / "started").read_text())


def test_a_stop_lets_the_run_in_flight_finish(tmp_path):
    serve, run_id, markers, pid = _held_run(tmp_path, stop_timeout=str(WAIT_LIMIT_S))
    serve.send_signal(signal.SIGTERM)
    give_up = time.monotonic() + WAIT_LIMIT_S
    while "stopping" not in serve_log(tmp_path):
        assert time.monotonic() < give_up, serve_log(tmp_path)
        time.sleep(0.2)
    assert serve.poll() is None, "serve waits for the run in flight"
    (markers / "release").touch()
    assert _exited(serve, tmp_path) == 0
    assert final_state(run_id).is_completed(), serve_log(tmp_path)
    assert f"flow run {run_id}: finished" in serve_log(tmp_path)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_stop_past_its_timeout_ends_the_run_and_marks_it_crashed(tmp_path):
    serve, run_id, markers, pid = _held_run(tmp_path, stop_timeout="0")
    serve.send_signal(signal.SIGTERM)
    assert _exited(serve, tmp_path) == 0
    state = final_state(run_id)
    assert state.is_crashed() and "tokenlake serve stopped" in (state.message or ""), (
        state,
        serve_log(tmp_path),
    )
    assert f"flow run {run_id}: marked Crashed" in serve_log(tmp_path)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, (
        "no flow-run process is left behind"
    )
    assert not (markers / "release").exists()


def test_a_negative_stop_timeout_is_refused_before_anything_starts(capsys):
    from flows.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--stop-timeout", "-1"])
    assert exited.value.code == 2
    assert "--stop-timeout: must be 0 or more seconds" in capsys.readouterr().err
