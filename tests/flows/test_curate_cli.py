"""`tokenlake curate --config FILE [--json]`, `tokenlake datasets`, `tokenlake janitor`, from the shell's view:
results, and failures as sentences (a gate's paragraph, a flag's range, a ref that does not exist)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flows.cli import main
from flows.params import CurateParams
from tests.flows.curate_support import FILES_SOURCES_TOML, write_corpus
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")

CONFIG = (
    FILES_SOURCES_TOML
    + """
[shards]
vocab_size = 300
seq_len = 64

[gates]
min_documents = 10

[repository]
spec = "repo"
results = "results"
"""
)


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
    assert [row["stage"] for row in made["stages"]] == [
        "ingest",
        "validate",
        "dedup",
        "safety",
        "shard",
        "mix",
    ]

    assert main(["--repo", str(tmp_path / "repo"), "datasets", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["tag"], listed["commit_id"]) == (made["tag"], made["commit_id"])
    assert set(listed["tokens"]) == {"prose", "code"} and all(n > 0 for n in listed["tokens"].values())
    assert set(listed["documents"]) == {"prose", "code"}

    assert main(["--repo", str(tmp_path / "repo"), "datasets"]) == 0
    table = capsys.readouterr().out
    assert made["tag"] in table and "prose" in table and "code" in table
    assert "in shards" in table.splitlines()[0], "the table says what each number counts"

    # the documents datasets counts "in shards" are those `shards verify` finds
    assert main(["--repo", str(tmp_path / "repo"), "shards", "verify", made["tag"], "--json"]) == 0
    verified: dict[str, int] = {}
    for check in json.loads(capsys.readouterr().out)["checks"]:
        if check["source"]:
            verified[check["source"]] = verified.get(check["source"], 0) + check["documents"]
    assert listed["documents_in_shards"] == verified and all(n > 0 for n in verified.values())
    assert all(listed["documents_in_shards"][s] <= listed["documents"][s] for s in verified)

    assert main(["--repo", str(tmp_path / "repo"), "janitor", "--max-age", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["branches"] == [], "a published run leaves no branch behind"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("[dedup]\ntreshold = 0.5\n", "dedup.treshold: Extra inputs are not permitted"),
        (
            "[[ingest.sources]]\nname = 'x'\nkind = 'prose'\nformat = 'files'\npath = 'nowhere'\n",
            "does not exist",
        ),
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


def test_a_failing_gate_is_one_paragraph_naming_gate_expectations_data_docs_and_main(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    write_corpus(tmp_path / "sources")
    config = tmp_path / "curate.toml"
    config.write_text(CONFIG + "\n[validation.gate]\nmax_text_chars = 10\n")  # every document is longer
    assert main(["curate", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("tokenlake: error: the validate stage's gate failed")
    assert "expect_column_values_to_be_between(text_chars)" in err, "the failing expectation is named"
    docs = next(
        line.removeprefix("Data Docs: ") for line in err.splitlines() if line.startswith("Data Docs: ")
    )
    assert docs.startswith("file://") and os.path.isfile(docs.removeprefix("file://"))
    *_, state, change = err.strip().splitlines()
    assert (
        state.startswith("main is unchanged")
        and "the run branch curate-" in state
        and state.endswith("was removed.")
    )
    assert change.startswith("To publish: ") and "[validation] settings" in change, "what to change"
    assert set(LocalRepo(tmp_path / "repo").list_branches()) == {"main"}


def test_flag_values_out_of_range_are_one_sentence_naming_the_flag(capsys):
    for argv, says in [
        (["run", "--steps", "-1"], "argument --steps: expected a whole number >= 0 (0: curate only), got -1"),
        (["train", "--nproc", "0"], "argument --nproc: expected a whole number >= 1, got 0"),
        (["run", "--code-mb", "0"], "argument --code-mb: expected a number > 0, got 0"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and says in err and "\n" not in err, err


def test_a_dataset_ref_that_does_not_exist_fails_before_prefect_starts(tmp_path):
    """No Prefect API is reachable at this URL: a sentence about the ref proves none was needed."""
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.create_tag("ds-20260101-1", "main")
    env = os.environ | {"PREFECT_API_URL": "http://127.0.0.1:9/api", "TOKENLAKE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--repo", str(repo.root), "train", "--dataset", "ds-nope"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        f"tokenlake: error: --dataset ds-nope: no such tag, branch or commit in the repository {repo.root} "
        "(tags: ds-20260101-1; branches: main)"
    )

    bad = [
        sys.executable,
        "-m",
        "flows.cli",
        "--repo",
        str(repo.root),
        "train",
        "--dataset",
        "main",
        "--preset",
        "huge",
    ]
    done = subprocess.run(bad, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith(
        "tokenlake: error: --preset: Input should be 'tiny'"
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_run_refused_because_main_moved_says_what_moved_it_not_unexpected(tmp_path):
    from flows.failed_run import failure_report, repository_state
    from flows.wap import MainMoved

    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    before = repo.resolve("main")
    repo.put("main", "mix.json", b"{}")
    moved = repo.commit("main", "another run's publish", {}).id
    refusal = MainMoved(
        "main moved while this run was curating: flow run r2 published ds-20260101-1 (commit 0123456789ab); "
        "nothing was merged, run curate again to build on it"
    )
    lines = failure_report(refusal, repository_state(str(repo.root), before, "curate-r1")).splitlines()
    assert lines[0] == f"not published: {refusal}."
    assert lines[-1] == (
        f"main moved from {before[:12]} to {moved[:12]} (another run published?) and the run branch curate-r1 was removed."
    )
