"""``tokenlake repo ...`` against a real local repository, through ``flows.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from versioning.local import LocalRepo


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    """main: two commits and a tag; dev: one more commit and a staged change."""
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.put("main", "raw/a.txt", b"alpha\n")
    repo.put("main", "raw/b.bin", bytes(range(256)))
    repo.commit("main", "ingest", {"stage": "ingest"})
    repo.create_tag("v1", "main")
    repo.create_branch("dev", "main")
    repo.put("dev", "raw/a.txt", b"alpha, edited\n")
    repo.put("dev", "mix.json", b'{"seed": 1}')
    repo.delete("dev", "raw/b.bin")
    repo.commit("dev", "edit on dev")
    repo.put("dev", "staged-only", b"not committed")
    repo.close()
    return tmp_path / "repo"


def run(repo_dir: Path, *args: str) -> int:
    return main(["--repo", str(repo_dir), "repo", *args])


def test_log_table_and_json(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    assert run(repo_dir, "log", "dev") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["commit", "created", "(UTC)", "kind", "message", "stage,", "counts,", "gate"]
    assert [line.split("  ")[-1].strip() for line in lines[1:3]] == ["edit on dev", "ingest"]
    assert len(lines) == 5 and lines[-1] == "(every metadata field of each commit: --json)"
    assert lines[1].index("edit on dev") == lines[2].index("ingest")  # aligned columns

    assert run(repo_dir, "log", "--limit", "1", "--json") == 0
    commits = json.loads(capsys.readouterr().out)
    assert len(commits) == 1
    assert commits[0]["message"] == "ingest" and commits[0]["metadata"] == {"stage": "ingest"}
    assert len(commits[0]["id"]) == 64 and len(commits[0]["parents"]) == 1


def test_branches_and_tags(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    repo = LocalRepo(repo_dir)
    assert run(repo_dir, "branches", "--json") == 0
    assert json.loads(capsys.readouterr().out) == repo.list_branches()
    assert run(repo_dir, "tags") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["tag", "commit"]
    assert out[1].split() == ["v1", repo.resolve("v1")]
    assert run(repo_dir, "branches") == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["branch", "dev", "main"]


def test_ls_shows_staged_objects_on_a_branch(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    assert run(repo_dir, "ls", "dev", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(o["path"], o["size"]) for o in listed] == [
        ("mix.json", 11),
        ("raw/a.txt", 14),
        ("staged-only", 13),
    ]
    assert run(repo_dir, "ls", "v1", "raw/") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:3]] == [["raw/a.txt", "6"], ["raw/b.bin", "256"]]
    assert lines[1].index("6 ") + 1 == lines[2].index("256 ") + 3  # sizes right-aligned
    assert lines[-1] == "2 object(s), 262 bytes at v1 under 'raw/'"


def test_show_writes_the_bytes(repo_dir: Path, capsysbinary: pytest.CaptureFixture[bytes]):
    assert run(repo_dir, "show", "v1:raw/b.bin") == 0
    assert capsysbinary.readouterr().out == bytes(range(256))
    assert run(repo_dir, "show", "dev:staged-only") == 0
    assert capsysbinary.readouterr().out == b"not committed"


def test_show_json_describes_the_object(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    assert run(repo_dir, "show", "main:raw/a.txt", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == "raw/a.txt" and shown["size"] == 6
    assert shown["commit_id"] == LocalRepo(repo_dir).resolve("main")


def test_diff(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    assert run(repo_dir, "diff", "main", "dev") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines[:4]] == [
        ["change", "path"],
        ["added", "mix.json"],
        ["changed", "raw/a.txt"],
        ["removed", "raw/b.bin"],
    ]
    assert lines[-1] == "1 added, 1 removed, 1 changed from main to dev"
    assert run(repo_dir, "diff", "main", "dev", "--prefix", "raw/", "--json") == 0
    assert json.loads(capsys.readouterr().out) == [
        {"path": "raw/a.txt", "kind": "changed"},
        {"path": "raw/b.bin", "kind": "removed"},
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("log", "nope"), "'nope' not found"),
        (("show", "main:raw/none"), "'raw/none' not found"),
        (("show", "no-colon"), "expected REF:PATH"),
        (("ls", "main", "p" * 1025), "at most 1024"),  # lakeFS's key limit; "../up" is a key like any other
    ],
)
def test_errors_are_one_sentence(
    repo_dir: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
):
    assert run(repo_dir, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenlake: error: ") and message in err
    assert "Traceback" not in err


def test_a_missing_repository_is_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert run(tmp_path / "nothing-here", "branches") == 2
    assert "no repository" in capsys.readouterr().err
    assert not (tmp_path / "nothing-here").exists()


def test_limit_must_be_a_number(repo_dir: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        run(repo_dir, "log", "--limit", "-3")
    assert "argument --limit: expected a whole number >= 0, got -3" in capsys.readouterr().err


def test_log_shows_stage_counts_and_gate_and_json_has_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    meta = {"stage": "validate", "documents_in": "853", "kept": "750", "rejected": "103", "tokens": "0",
            "gate": "passed", "gate_summary": "passed 27/27 expectations " + "x" * 200, "input_commit": "a" * 64}  # fmt: skip
    repo.commit("main", "validate: kept 750 of 853", meta, allow_empty=True)
    assert run(tmp_path / "repo", "log", "--limit", "1") == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.endswith("validate: kept 750 of 853  validate, kept 750 of 853, gate passed")
    assert run(tmp_path / "repo", "log", "--limit", "1", "--json") == 0
    assert json.loads(capsys.readouterr().out)[0]["metadata"] == meta


def test_log_leaves_out_the_document_counts_of_a_stage_that_reads_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    meta = {"stage": "mix", "documents_in": "0", "kept": "0", "rejected": "0", "tokens": "2242304"}
    repo.commit("main", "mix: 4379 samples over 2 sources, mix 0123456789ab", meta, allow_empty=True)
    assert run(tmp_path / "repo", "log", "--limit", "1") == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.endswith("mix: 4379 samples over 2 sources, mix 0123456789ab  mix, 2242304 tokens")
