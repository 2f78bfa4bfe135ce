"""A flow that holds until the test releases it: a run in flight for as long as a test needs,
whatever the machine's speed (tests/flows/test_serve_stop.py serves it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prefect import flow


@flow(name="held")
def held(marker_dir: str) -> str:
    """Writes ``started`` (its pid), then waits for ``release`` to exist."""
    markers = Path(marker_dir)
    (markers / "started").write_text(str(os.getpid()))
    while not (markers / "release").exists():
        time.sleep(0.1)
    return "released"
