"""``tokenlake shards verify REF``: table, JSON, exit status, faults named."""

from __future__ import annotations

import json

import pytest

from flows import cli
from formats.shards import HEADER_SIZE, Manifest
from tests.tasks.test_shard_stage import build_dedup_repo, shard_on_branch


@pytest.fixture(scope="module")
def sharded_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "repo"
    repo, input_commit = build_dedup_repo(root)
    result = shard_on_branch(repo, input_commit, "curate-1")
    manifest = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    flipped = manifest.shards_of("web")[1].name
    repo.create_branch("broken", "curate-1")
    data = bytearray(repo.get("broken", flipped))
    data[HEADER_SIZE + 3] ^= 0x01
    repo.put("broken", flipped, bytes(data))
    repo.commit("broken", "flip one bit")
    yield str(root), manifest, flipped
    repo.close()


@pytest.fixture
def tokenlake(monkeypatch):
    if "flows.commands.shards" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", ["flows.commands.shards"])
    return cli.main


def test_verify_prints_a_table_and_exits_zero_on_a_sound_version(sharded_repo, tokenlake, capsys) -> None:
    root, manifest, _ = sharded_repo
    assert tokenlake(["--repo", root, "shards", "verify", "curate-1"]) == 0
    out = capsys.readouterr().out
    for entry in manifest.shards:
        assert f"{entry.name}  " in out
    assert out.splitlines()[0].split() == ["name", "sequences", "documents", "bytes", "status"]
    assert out.splitlines()[-1].startswith(
        f"OK: {len(manifest.shards)} shards, {manifest.totals['sequences']} sequences"
    )


def test_verify_names_a_bit_flipped_shard_and_exits_one(sharded_repo, tokenlake, capsys) -> None:
    root, _, flipped = sharded_repo
    assert tokenlake(["--repo", root, "shards", "verify", "broken"]) == 1
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith(flipped)]
    assert "FAULT: sha256 does not match the manifest" in row
    assert (
        out.splitlines()[-1]
        == f"FAULT: 1 of {len(out.splitlines()) - 2} objects at broken have faults: {flipped}"
    )


def test_verify_json_output(sharded_repo, tokenlake, capsys) -> None:
    root, manifest, flipped = sharded_repo
    assert tokenlake(["--repo", root, "shards", "verify", "broken", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    faulty = [c["name"] for c in report["checks"] if c["status"] != "ok"]
    assert faulty == [flipped]
    assert len(report["checks"]) == len(manifest.shards) + 2


def test_verify_of_a_version_without_shards_is_a_fault_not_a_crash(sharded_repo, tokenlake, capsys) -> None:
    root, _, _ = sharded_repo
    assert tokenlake(["--repo", root, "shards", "verify", "main"]) == 1
    assert "no shards/manifest.json at main" in capsys.readouterr().out


def test_verify_of_an_unknown_ref_is_one_sentence(sharded_repo, tokenlake, capsys) -> None:
    root, _, _ = sharded_repo
    assert tokenlake(["--repo", root, "shards", "verify", "no-such-branch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenlake: error:") and "no-such-branch" in err and "Traceback" not in err
