"""The lakeFS backends of the contract suite: LakeFSRepo over the API double (with and
without faults) and over the session's real lakeFS (``tests/lakefs_real``).

The double's validation mode is on: a backend fails its test if any request or response
broke the official spec (a request that breaks it is also answered 400, as lakeFS does), or
if the SDK called an endpoint the double does not implement.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

import lakefs
import lakefs.exceptions

from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.lakefs_real import real_lakefs
from versioning import DataRepo
from versioning.lakefs import LakeFSRepo, RetryPolicy

# Retries fast enough for tests, patient enough that 20% faults never exhaust them
# (six failures in a row: 0.2**6, about one call in 15,000).
TEST_RETRY = RetryPolicy(attempts=8, base_delay_s=0.002, max_delay_s=0.02)
FAULTS = FaultConfig(error_rate=0.1, drop_rate=0.1, latency_s=0.0, seed=20240601)


def connect(double: LakeFSDouble, repository: str = "contract", **options) -> LakeFSRepo:
    """A LakeFSRepo talking to ``double`` with the test retry policy (overridable)."""
    options.setdefault("retry", TEST_RETRY)
    return LakeFSRepo.connect(
        double.endpoint, double.access_key_id, double.secret_access_key, repository, **options
    )


@contextmanager
def double_backend(workdir: Path, faults: FaultConfig | None = None) -> Iterator[DataRepo]:
    with LakeFSDouble(workdir / "lakefs-double", faults=faults) as double:
        yield connect(double)
        assert double.violations == [], "the lakeFS double saw spec violations:\n" + "\n".join(
            double.violations
        )
        assert double.rejected == [], "the adapter sent requests the spec refuses:\n" + "\n".join(
            double.rejected
        )
        if faults is not None:
            assert sum(double.injected.values()) > 0, "the faulty backend injected no faults"


def faulty_double_backend(workdir: Path) -> AbstractContextManager[DataRepo]:
    return double_backend(workdir, FAULTS)


@contextmanager
def real_backend(workdir: Path) -> Iterator[DataRepo]:
    """A fresh repository on the session's real lakeFS (``tests/lakefs_real``), deleted afterwards."""
    server = real_lakefs()
    name = f"tokenlake-test-{uuid.uuid4().hex[:12]}"
    repo = LakeFSRepo.connect(
        server.endpoint,
        server.access_key_id,
        server.secret_access_key,
        name,
        storage_namespace=f"{server.namespace_prefix}/{name}",
    )
    try:
        yield repo
    finally:
        client = lakefs.Client(
            host=server.endpoint, username=server.access_key_id, password=server.secret_access_key
        )
        with suppress(lakefs.exceptions.NotFoundException):
            lakefs.Repository(name, client=client).delete()


LAKEFS_BACKENDS: dict[str, Callable[[Path], AbstractContextManager[DataRepo]]] = {
    "lakefs-double": double_backend,
    "lakefs-double-faults": faulty_double_backend,
    "lakefs-real": real_backend,
}
