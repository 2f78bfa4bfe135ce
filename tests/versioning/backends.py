"""Every DataRepo backend the contract suite runs against, by name.

A factory takes an empty directory it may use and is a context manager yielding a
repository; it may call ``pytest.skip`` (with the reason) when its backend cannot
run here. The lakeFS factories live in ``tests/versioning/lakefs_backends.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from versioning import DataRepo
from versioning.local import LocalRepo

BackendFactory = Callable[[Path], AbstractContextManager[DataRepo]]


@contextmanager
def local_backend(workdir: Path) -> Iterator[DataRepo]:
    repo = LocalRepo(workdir / "repo")
    repo.ensure()
    try:
        yield repo
    finally:
        repo.close()


BACKENDS: dict[str, BackendFactory] = {"local": local_backend}

try:
    from tests.versioning.lakefs_backends import LAKEFS_BACKENDS
except ModuleNotFoundError as exc:
    # Only a missing module means "no lakeFS backends"; a broken one must fail loudly.
    if exc.name != "tests.versioning.lakefs_backends":
        raise
    LAKEFS_BACKENDS = {}

BACKENDS.update(LAKEFS_BACKENDS)
