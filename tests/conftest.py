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


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session; use it in tests that run flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def repo_root() -> Path:
    return _ROOT
