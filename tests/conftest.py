"""Test-wide settings: telemetry off, Prefect state inside the project, one Prefect harness."""

from __future__ import annotations

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", str(_ROOT / ".prefect" / "test"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)

import pytest  # noqa: E402

HARNESS_STARTUP_TIMEOUT_S = 60
HARNESS_ATTEMPTS = 3
_harness_failure: list[str] = []


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session; use it in tests that run flows.

    Each start waits at most 60 s for the API. On a heavily loaded machine the server's
    imports and migrations can take longer than that, so a start that times out is stopped
    and tried again, up to three times. If every attempt fails, the failure is remembered
    and the remaining tests that need the API fail at once with it instead of waiting again.
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    if _harness_failure:
        pytest.fail(_harness_failure[0], pytrace=False)
    for attempt in range(1, HARNESS_ATTEMPTS + 1):
        harness = prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_TIMEOUT_S)
        try:
            harness.__enter__()
        except RuntimeError as exc:
            SubprocessASGIServer().stop()  # the harness's server, still starting: stop it before retrying
            if attempt == HARNESS_ATTEMPTS:
                _harness_failure.append(f"the Prefect test API did not start in {attempt} attempts: {exc}")
                raise
            continue
        try:
            yield
        finally:
            harness.__exit__(None, None, None)
        return


@pytest.fixture
def repo_root() -> Path:
    return _ROOT


def pytest_sessionfinish(session, exitstatus):
    from tests.lakefs_real import stop_real_lakefs

    stop_real_lakefs()
