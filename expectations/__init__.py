"""Great Expectations suites stored as JSON, one per checked artifact."""

from __future__ import annotations

import json
from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent


def load_suite(name: str) -> dict:
    """The suite ``<name>.json`` as a dict; raises FileNotFoundError naming the suite."""
    path = SUITES_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no expectation suite {name!r} in {SUITES_DIR}")
    return json.loads(path.read_text())
