"""Pre-signed uploads on a real lakeFS over S3 (MinIO): which path each ``put`` takes.

lakeFS counts every API call by operation in its Prometheus metrics (``/metrics``), so the tests
read which operations a ``put`` cost: a large object goes to S3 through a pre-signed URL and is
linked (``GetPhysicalAddress`` + ``LinkPhysicalAddress``, no ``UploadObject``), a small one and
any object with ``presign_uploads=False`` through the API (``UploadObject``). Either way the
bytes read back the same.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
import uuid
from collections import Counter

import pytest

from tests.lakefs_real import real_lakefs
from versioning.lakefs.repo import PRESIGN_MIN_BYTES

COUNT = re.compile(r'^api_request_duration_seconds_count\{code="(\d+)",operation="(\w+)"\} (\d+)$')


def operations(endpoint: str) -> Counter:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=30) as response:
        text = response.read().decode()
    counts: Counter = Counter()
    for line in text.splitlines():
        if match := COUNT.match(line):
            counts[match[2]] += int(match[3])
    return counts


def operations_after(endpoint: str, before: Counter, expected: str) -> Counter:
    """The operations since ``before``, once ``expected`` is among them (lakeFS records a call
    just after it answers it)."""
    deadline = time.monotonic() + 60
    while True:
        done = operations(endpoint) - before
        if done[expected] or time.monotonic() > deadline:
            return done
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server():
    return real_lakefs()


@pytest.fixture
def repository(server):
    name = f"presign-{uuid.uuid4().hex[:12]}"
    repo = server.connect(name)
    repo.ensure()
    yield name
    repo._repo.delete()


def test_a_large_object_goes_to_s3_pre_signed_and_is_linked(server, repository):
    repo = server.connect(repository)
    payload = os.urandom(PRESIGN_MIN_BYTES + 1)
    before = operations(server.endpoint)
    stat = repo.put("main", "large.bin", payload)
    done = operations_after(server.endpoint, before, "LinkPhysicalAddress")
    assert done["GetPhysicalAddress"] == 1 and done["LinkPhysicalAddress"] == 1, done
    assert done["UploadObject"] == 0, done
    assert stat.size == len(payload)
    assert repo.get("main", "large.bin") == payload
    repo.commit("main", "a pre-signed upload")
    assert repo.get("main", "large.bin") == payload


def test_small_objects_and_presign_off_go_through_the_api(server, repository):
    small = os.urandom(1024)
    large = os.urandom(PRESIGN_MIN_BYTES + 1)
    endpoint = server.endpoint
    for repo, name, payload in [
        (server.connect(repository), "small.bin", small),
        (server.connect(repository, presign_uploads=False), "large.bin", large),
    ]:
        before = operations(endpoint)
        repo.put("main", name, payload)
        done = operations_after(endpoint, before, "UploadObject")
        assert done["UploadObject"] == 1 and done["LinkPhysicalAddress"] == 0, (name, done)
        assert repo.get("main", name) == payload


def test_presign_follows_the_environment(server, repository, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_LAKEFS_PRESIGN", "false")
    assert server.connect(repository).presign_uploads is False
    monkeypatch.setenv("TOKENLAKE_LAKEFS_PRESIGN", "auto")
    assert server.connect(repository).presign_uploads is None
