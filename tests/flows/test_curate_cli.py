"""`tokenlake curate --config FILE [--json]`, `tokenlake datasets`, `tokenlake janitor`, from the shell's view."""

from __future__ import annotations

import json

import pytest

from flows.cli import main
from flows.params import CurateParams
from tests.flows.curate_support import write_corpus

pytestmark = pytest.mark.usefixtures("prefect_harness")

CONFIG = """
[[ingest.sources]]
name = "prose"
kind = "prose"
format = "files"
path = "sources/prose"

[[ingest.sources]]
name = "code"
kind = "code"
format = "files"
path = "sources/code"

[shards]
vocab_size = 300
seq_len = 64

[gates]
min_documents = 10

[repository]
spec = "repo"
results = "results"
"""


def test_curate_from_a_toml_file_then_list_the_published_version(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    write_corpus(tmp_path / "sources")
    config = tmp_path / "curate.toml"
    config.write_text(CONFIG)
    params = CurateParams.from_toml(config)
    assert params.ingest.sources[0].path == str(tmp_path / "sources" / "prose"), "relative to the file"

    assert main(["curate", "--config", str(config), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["new"] and made["tag"].startswith("ds-")
    assert [row["stage"] for row in made["stages"]] == ["ingest", "validate", "dedup", "shard", "mix"]

    assert main(["--repo", str(tmp_path / "repo"), "datasets", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["tag"], listed["commit_id"]) == (made["tag"], made["commit_id"])
    assert set(listed["tokens"]) == {"prose", "code"} and all(n > 0 for n in listed["tokens"].values())
    assert set(listed["documents"]) == {"prose", "code"}

    assert main(["--repo", str(tmp_path / "repo"), "datasets"]) == 0
    table = capsys.readouterr().out
    assert made["tag"] in table and "prose" in table and "code" in table

    assert main(["--repo", str(tmp_path / "repo"), "janitor", "--max-age", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [], "a published run leaves no branch behind"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("[dedup]\ntreshold = 0.5\n", "dedup.treshold: Extra inputs are not permitted"),
        ("[[ingest.sources]]\nname = 'x'\nkind = 'prose'\nformat = 'files'\npath = 'nowhere'\n", "does not exist"),
        ("[gates\n", "not valid TOML"),
    ],
)
def test_a_misconfiguration_fails_fast_with_one_sentence(tmp_path, capsys, config, says):
    path = tmp_path / "bad.toml"
    path.write_text(config + '[repository]\nspec = "repo"\n')
    assert main(["curate", "--config", str(path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tokenlake: error:") and says in error and "\n" not in error


def test_a_missing_config_file_is_named(tmp_path, capsys):
    assert main(["curate", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml' does not exist" in capsys.readouterr().err
