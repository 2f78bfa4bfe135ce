"""The real lakeFS the suite runs against: one server for the whole session, started on first use.

By default it is lakeFS v1.84.0 built from its Go module (``deploy/services.toml``, ``./dev
services``), on a free 127.0.0.1 port, with its embedded KV store and MinIO (also built from its
module) as its S3 blockstore, set up with generated credentials that are never printed. With
``TOKENLAKE_LAKEFS_ENDPOINT``, ``TOKENLAKE_LAKEFS_ACCESS_KEY_ID`` and
``TOKENLAKE_LAKEFS_SECRET_ACCESS_KEY`` set, the same cases run against that server instead (a team's
own lakeFS; ``TOKENLAKE_LAKEFS_STORAGE_NAMESPACE`` names where its test repositories go).

It is a process-wide singleton rather than a fixture because the contract suite's backends are
plain context managers (``tests/versioning/backends.py``); ``tests/conftest.py`` stops it when the
session ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from flows.services.lakefs import Environment, LakeFSServer
from flows.services.local_lakefs import LakeFSOnS3
from flows.services.minio import S3Endpoint
from versioning.lakefs import LakeFSRepo

ENDPOINT_ENV = "TOKENLAKE_LAKEFS_ENDPOINT"
ACCESS_KEY_ENV = "TOKENLAKE_LAKEFS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "TOKENLAKE_LAKEFS_SECRET_ACCESS_KEY"
NAMESPACE_ENV = "TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"


@dataclass
class RealLakeFS:
    endpoint: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    namespace_prefix: str
    server: LakeFSServer | None = None  # None: a server this session did not start
    s3: S3Endpoint | None = None
    s3_bucket: str | None = None

    def lakectl_environment(self) -> Environment:
        """What tokenlake reads to reach this server, and where its repositories go."""
        return Environment(
            LAKECTL_SERVER_ENDPOINT_URL=self.endpoint,
            LAKECTL_CREDENTIALS_ACCESS_KEY_ID=self.access_key_id,
            LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=self.secret_access_key,
            **{NAMESPACE_ENV: self.namespace_prefix},
        )

    def connect(self, repository: str, **options) -> LakeFSRepo:
        """A LakeFSRepo of ``repository`` on this server, in a namespace of its own."""
        options.setdefault("storage_namespace", f"{self.namespace_prefix}/{repository}")
        return LakeFSRepo.connect(
            self.endpoint, self.access_key_id, self.secret_access_key, repository, **options
        )


_lock = threading.Lock()
_started: list[tuple[RealLakeFS, LakeFSOnS3 | None, Path | None]] = []


def real_lakefs() -> RealLakeFS:
    """The session's real lakeFS, started (and its services built, if need be) on first call."""
    with _lock:
        if _started:
            return _started[0][0]
        if os.environ.get(ENDPOINT_ENV):
            missing = [name for name in (ACCESS_KEY_ENV, SECRET_KEY_ENV) if not os.environ.get(name)]
            if missing:
                raise RuntimeError(f"{ENDPOINT_ENV} is set, so set {' and '.join(missing)} too")
            external = RealLakeFS(
                os.environ[ENDPOINT_ENV].rstrip("/"),
                os.environ[ACCESS_KEY_ENV],
                os.environ[SECRET_KEY_ENV],
                (os.environ.get(NAMESPACE_ENV) or "local://tokenlake-tests").rstrip("/"),
            )
            _started.append((external, None, None))
            return external
        workdir = Path(tempfile.mkdtemp(prefix="tokenlake-real-lakefs-"))
        try:
            stack = LakeFSOnS3(workdir).start()
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        lakefs, minio = stack.lakefs, stack.minio
        started = RealLakeFS(
            lakefs.endpoint,
            lakefs.credentials.access_key_id,
            lakefs.credentials.secret_access_key,
            lakefs.storage_namespace("tests"),
            server=lakefs,
            s3=minio.endpoint,
            s3_bucket=minio.bucket,
        )
        _started.append((started, stack, workdir))
        return started


def stop_real_lakefs() -> None:
    with _lock:
        while _started:
            _, stack, workdir = _started.pop()
            if stack is not None:
                stack.stop()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
