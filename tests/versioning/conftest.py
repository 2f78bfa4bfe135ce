"""The ``repo`` fixture: a fresh, ensured repository of every registered backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.versioning.backends import BACKENDS
from versioning import DataRepo


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DataRepo]:
    with BACKENDS[request.param](tmp_path) as created:
        created.ensure()
        yield created
