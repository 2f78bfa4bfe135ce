"""Copying Data Docs out of the repository: any lakeFS key may be listed, only safe paths become files."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.curate import summary_links
from versioning import InvalidPath
from versioning.local import LocalRepo


def test_a_key_that_would_escape_the_copy_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.put("main", "reports/data_docs/ingest/index.html", b"<html>ingest</html>")
    repo.commit("main", "docs")
    repo.create_tag("v1", "main")
    links = summary_links(str(tmp_path / "repo"), "v1", None)
    copied = tmp_path / "home" / "data-docs" / "v1" / "ingest" / "index.html"
    assert links.data_docs == {"ingest": copied.as_uri()} and copied.read_bytes() == b"<html>ingest</html>"

    repo.put("main", "reports/data_docs/../../../escaped.html", b"written by another tool")
    repo.commit("main", "a hostile key")
    repo.create_tag("v2", "main")
    with pytest.raises(InvalidPath, match="'..'"):
        summary_links(str(tmp_path / "repo"), "v2", None)
    assert list(tmp_path.rglob("escaped.html")) == []
