"""The lakeFS API double holds itself to the official spec, and its faults are real and seeded."""

from __future__ import annotations

import base64
import http.client
import json
from pathlib import Path

import pytest

from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.lakefs_double.common import OPERATIONS, Reply
from tests.lakefs_double.spec import load_spec
from tests.versioning.lakefs_backends import connect
from versioning import MergeConflict, NotFound

# Everything LakeFSRepo does, with every error path the port defines.
EXPECTED_OPERATIONS = {
    "getRepository", "createRepository", "listBranches", "createBranch", "getBranch", "deleteBranch",
    "resetBranch", "hardResetBranch", "revertBranch", "listTags", "createTag", "getTag", "deleteTag",
    "commit", "getCommit", "logCommits", "diffRefs", "findMergeBase", "mergeIntoBranch",
    "uploadObject", "getObject", "statObject", "listObjects", "deleteObject",
}  # fmt: skip


def workload(repo, tmp_path: Path) -> None:
    repo.ensure()
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 40_000)
    repo.put("main", "data/big.bin", big)
    repo.put("main", "data/empty", b"")
    repo.put("main", "data/a", b"a")
    first = repo.commit("main", "first", {"stage": "ingest"})
    repo.create_tag("v1", "main")
    repo.create_branch("dev", "main")
    repo.put("dev", "data/a", b"dev")
    repo.commit("dev", "on dev")
    repo.put("main", "data/a", b"main")
    repo.commit("main", "on main")
    with pytest.raises(MergeConflict):
        repo.merge("dev", "main")
    repo.reset_hard("main", first.id)
    repo.merge("dev", "main", message="merge dev")
    assert repo.is_ancestor("v1", "main")
    with repo.open("main", "data/big.bin") as reader:
        reader.seek(-10, 2)
        assert len(reader.read()) == 10
    assert repo.get("main", "data/empty") == b""
    assert [s.path for s in repo.list("main", "data/")] == ["data/a", "data/big.bin", "data/empty"]
    assert repo.exists("main", "data/a") and not repo.exists("main", "nope")
    repo.delete("main", "data/empty")
    repo.discard_uncommitted("main")
    repo.put("main", "data/b", b"b")
    bad = repo.commit("main", "bad")
    repo.revert("main", bad.id)
    assert [c.kind for c in repo.diff("v1", "main")] == ["changed"]
    assert len(list(repo.log("main", limit=3))) == 3
    assert set(repo.list_branches()) == {"main", "dev"} and set(repo.list_tags()) == {"v1"}
    repo.delete_tag("v1")
    repo.delete_branch("dev")
    with pytest.raises(NotFound):
        repo.get("no-such-ref", "data/a")


def test_every_answer_of_a_full_workload_matches_the_spec(tmp_path: Path):
    with LakeFSDouble(tmp_path / "backing") as double:
        workload(connect(double), tmp_path)
        assert double.violations == []
        hit = set(double.requests)
    assert hit >= EXPECTED_OPERATIONS, f"not exercised: {sorted(EXPECTED_OPERATIONS - hit)}"
    assert hit <= set(load_spec().by_id) and hit <= set(OPERATIONS)


def test_the_validator_catches_a_response_that_breaks_the_spec(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(OPERATIONS, "getBranch", lambda call: Reply(200, json={"id": 7}))
    with LakeFSDouble(tmp_path) as double:
        status, _ = request(double, "GET", "/api/v1/repositories/any/branches/main")
    assert status == 200
    assert len(double.violations) == 1 and "getBranch" in double.violations[0]


def test_a_request_outside_the_spec_is_recorded(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        status, body = request(double, "GET", "/api/v1/repositories/x/not-an-endpoint")
    assert status == 404 and "message" in body
    assert double.violations == [
        "GET /api/v1/repositories/x/not-an-endpoint is not an endpoint of the lakeFS API spec"
    ]


def test_wrong_credentials_get_401_and_healthcheck_needs_none(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        assert request(double, "GET", "/api/v1/repositories", auth=(double.access_key_id, "wrong"))[0] == 401
        assert request(double, "GET", "/api/v1/repositories", auth=None)[0] == 401
        assert request(double, "GET", "/api/v1/repositories")[0] == 200
        assert request(double, "GET", "/api/v1/healthcheck", auth=None)[0] == 204
        assert double.violations == []


def test_ranges_follow_lakefs(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        repo.put("main", "ten", b"0123456789")
        repo.put("main", "empty", b"")
        objects = "/api/v1/repositories/contract/refs/main/objects?path="
        status, body, headers = request(
            double, "GET", objects + "ten", headers={"Range": "bytes=2-4"}, full=True
        )
        assert (status, body, headers["Content-Range"]) == (206, b"234", "bytes 2-4/10")
        status, body, headers = request(
            double, "GET", objects + "ten", headers={"Range": "bytes=-3"}, full=True
        )
        assert (status, body) == (206, b"789")
        status, _, headers = request(
            double, "GET", objects + "empty", headers={"Range": "bytes=0-9"}, full=True
        )
        assert (status, headers["Content-Range"]) == (416, "bytes */0")
        assert double.violations == []


def test_faults_are_seeded_and_switchable(tmp_path: Path):
    def run(seed: int) -> list[int]:
        with LakeFSDouble(tmp_path / str(seed), faults=FaultConfig(error_rate=0.5, seed=seed)) as double:
            return [request(double, "GET", "/api/v1/repositories")[0] for _ in range(40)]

    first, again = run(1), run(1)
    assert first == again and {200, 503} == set(first)
    assert run(2) != first
    with LakeFSDouble(tmp_path / "switch", faults=FaultConfig(error_rate=1.0)) as double:
        assert request(double, "GET", "/api/v1/repositories")[0] == 503
        double.faults = FaultConfig()
        assert request(double, "GET", "/api/v1/repositories")[0] == 200
        assert double.violations == []


def test_latency_slows_answers_without_changing_them_and_bad_rates_are_refused(tmp_path: Path):
    with LakeFSDouble(tmp_path, faults=FaultConfig(latency_s=0.01)) as double:
        assert request(double, "GET", "/api/v1/repositories")[0] == 200
        assert double.injected == {}
    with pytest.raises(ValueError):
        FaultConfig(error_rate=0.7, drop_rate=0.5)


def test_a_restarted_double_serves_the_same_repositories(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        repo.ensure()
        repo.put("main", "kept", b"across restarts")
        head = repo.commit("main", "persist").id
    with LakeFSDouble(tmp_path) as double:
        repo = connect(double)
        assert repo.resolve("main") == head and repo.get("main", "kept") == b"across restarts"


def test_dropped_requests_close_the_connection_without_an_answer(tmp_path: Path):
    with LakeFSDouble(tmp_path, faults=FaultConfig(drop_rate=1.0)) as double:
        with pytest.raises(http.client.RemoteDisconnected):
            request(double, "GET", "/api/v1/repositories")
        assert sum(double.injected.values()) == 1


def test_the_secret_never_appears_in_the_double_repr(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        assert double.secret_access_key not in repr(double)


def request(double: LakeFSDouble, method: str, path: str, *, auth=(), headers=None, full=False):
    """One raw HTTP request (no SDK); ``auth=()`` uses the double's credentials."""
    host, port = double.endpoint.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = dict(headers or {})
    if auth == ():
        auth = (double.access_key_id, double.secret_access_key)
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if full:
        return response.status, body, response.headers
    is_json = response.headers.get("Content-Type") == "application/json"
    return response.status, json.loads(body) if is_json else body
