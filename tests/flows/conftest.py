"""Fixtures shared by the lineage and rollback tests."""

from __future__ import annotations

import pytest

from tests.flows.lineage_support import BACKENDS


@pytest.fixture(params=list(BACKENDS))
def backend(request, tmp_path):
    """(repository, spec) on each backend: the local adapter and lakeFS over the API double."""
    with BACKENDS[request.param](tmp_path) as (repo, spec):
        yield repo, spec
