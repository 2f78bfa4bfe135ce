"""Races between processes on one local repository: nothing lost, nothing corrupted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.versioning.crash_workers import ConsistencyCheck
from versioning.local import LocalRepo

WORKERS = "tests.versioning.crash_workers"


def race(root: Path, cwd: Path, jobs: list[tuple[str, str, int]]) -> list[object]:
    """Start one worker per (mode, name, count), release them together, return their results."""
    go_file = root.parent / "go"
    go_file.unlink(missing_ok=True)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", WORKERS, "race", str(root), mode, name, str(go_file), str(count)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for mode, name, count in jobs
    ]
    # Release them only when all are ready, so that they really overlap.
    ready = [Path(f"{go_file}.{name}.ready") for _, name, _ in jobs]
    while not all(path.exists() for path in ready):
        assert all(p.poll() is None for p in processes), "a race worker died before the start"
        time.sleep(0.005)
    go_file.touch()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode()
        results.append(json.loads(out))
    return results


@pytest.fixture
def local(tmp_path: Path) -> LocalRepo:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    return repo


@pytest.mark.slow
def test_two_processes_committing_to_different_branches(local: LocalRepo, repo_root: Path):
    count = 40
    local.create_branch("left", "main")
    local.create_branch("right", "main")
    root_commit = local.resolve("main")
    left, right = race(local.root, repo_root, [("commit", "left", count), ("commit", "right", count)])
    for name, commits in (("left", left), ("right", right)):
        history = [c.id for c in local.log(name)]
        assert history == [*reversed(commits), root_commit]  # every commit, in order
        files = {s.path: local.get(name, s.path) for s in local.list(name)}
        assert len(files) == 2 * count
        assert files[f"{name}/{count - 1}"] == f"{name} {count - 1}".encode()
        assert files[f"{name}/shared-7"] == b"same bytes in every worker 7"
    assert local.resolve("main") == root_commit
    ConsistencyCheck()(local)


@pytest.mark.slow
def test_two_processes_merging_into_main(local: LocalRepo, repo_root: Path):
    count = 12
    left, right = race(local.root, repo_root, [("merge", "left", count), ("merge", "right", count)])
    history = {c.id for c in local.log("main")}
    assert set(left) | set(right) <= history
    assert len(history) == 1 + 2 * count + 2 * count  # root, feature commits, merge commits
    for name in ("left", "right"):
        for i in range(count):
            assert local.get("main", f"{name}/{i}") == f"{name} {i}".encode()
    ConsistencyCheck()(local)


@pytest.mark.slow
def test_conflicting_merges_racing_into_main(local: LocalRepo, repo_root: Path):
    for round_number in range(3):
        before = local.resolve("main")
        for name in ("a", "b"):
            branch = f"{name}{round_number}"
            local.create_branch(branch, "main")
            local.put(branch, "same.txt", f"{branch} wants this".encode())
            local.put(branch, f"only-{branch}", b"x")
            local.commit(branch, f"{branch} change")
        results = race(
            local.root,
            repo_root,
            [("conflict-merge", f"a{round_number}", 0), ("conflict-merge", f"b{round_number}", 0)],
        )
        winners = [name for name, result in zip("ab", results, strict=True) if "merged" in result]  # type: ignore[operator]
        losers = [result for result in results if "conflict" in result]  # type: ignore[operator]
        assert len(winners) == 1 and losers == [{"conflict": ["same.txt"]}], results
        winner, loser = f"{winners[0]}{round_number}", f"{'b' if winners[0] == 'a' else 'a'}{round_number}"
        main = local.get_commit("main")
        assert main.parents == (before, local.resolve(winner))
        assert local.get("main", "same.txt") == f"{winner} wants this".encode()
        assert local.exists("main", f"only-{winner}") and not local.exists("main", f"only-{loser}")
    ConsistencyCheck()(local)
