"""The default repository is decided in one place: ``versioning.default_repo_spec``."""

from __future__ import annotations

from pathlib import Path

from versioning import default_repo_spec, open_repo


def test_the_default_is_tokenlake_repo_else_the_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TOKENLAKE_REPO", raising=False)
    assert Path(default_repo_spec()) == (tmp_path / "home" / "repo").resolve()
    monkeypatch.setenv("TOKENLAKE_REPO", str(tmp_path / "elsewhere"))
    assert default_repo_spec() == str(tmp_path / "elsewhere")


def test_open_repo_without_a_spec_opens_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENLAKE_REPO", str(tmp_path / "chosen"))
    repo = open_repo()
    try:
        assert (tmp_path / "chosen").is_dir() and repo.list_branches()
    finally:
        repo.close()
