"""Great Expectations gates: the suites in expectations/ match the stage schemas, a failing
expectation gives a readable message and Data Docs, a gate run is a GX Checkpoint run with a
name that says what it checked (a sample says so), and a failing suite blocks its stage
(nothing committed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from expectations import load_suite
from tasks.gates import Coverage, ExpectationsFailed, GateCheck, run_gate, stats_rows, stats_table
from tasks.ingest import IngestConfig, SourceConfig, run_ingest
from tasks.quality.prose import PROSE_RULES
from tasks.schema import DOCUMENT_SCHEMA, document_id
from tasks.stage import run_stage
from tasks.validate import SIGNAL_FIELDS, ValidateConfig
from tasks.validate.stage import run_validate
from versioning import open_repo

TEXT = "A plain sentence of prose that is long enough to be kept by ingest and by the filters."


def _columns(suite: str) -> list[str]:
    (expectation,) = [
        e for e in load_suite(suite)["expectations"] if e["type"] == "expect_table_columns_to_match_set"
    ]
    return expectation["kwargs"]["column_set"]


def test_suites_describe_the_stage_schemas() -> None:
    assert _columns("raw_documents") == [*DOCUMENT_SCHEMA.names, "text_chars"]
    assert _columns("filtered_documents") == [
        *DOCUMENT_SCHEMA.names,
        *(f.name for f in SIGNAL_FIELDS),
        "text_chars",
    ]


def _documents(rows: list[tuple[str, str, str]]) -> pa.Table:
    return pa.table(
        {
            "id": [document_id(s, loc) if i is None else i for i, s, loc in rows],
            "source": [s for _, s, _ in rows],
            "text": [TEXT] * len(rows),
            "locator": [loc for _, _, loc in rows],
            "meta": ["{}"] * len(rows),
            "text_chars": [len(TEXT)] * len(rows),
        }
    )


def test_failed_expectations_read_as_expectation_observed_expected(tmp_path: Path) -> None:
    duplicate = document_id("a", "x")
    frame = _documents([(duplicate, "a", "x"), (duplicate, "a", "y"), (None, "stranger", "z")])
    stats = stats_table(stats_rows("a", 10, 4, {"word_count": 6}, lambda _rule: (0.0, 0.5)))
    outcome = run_gate(
        [
            GateCheck("raw_documents", frame, {"sources": ["a", "b"], "max_text_chars": 1000}, ["locator"]),
            GateCheck("stage_stats", stats, {}, ["source", "rule"]),
        ],
        "ingest-0123456789ab-all-3",
        Coverage.everything(3, "documents"),
        tmp_path / "docs",
    )
    assert not outcome.success
    text = "\n".join(outcome.failures)
    assert "raw_documents: expect_column_values_to_be_unique(id): observed 2 of 3 rows unexpected" in text
    assert '"locator": "x"' in text and '"locator": "y"' in text
    assert "expect_column_values_to_be_in_set(source)" in text and "stranger" in text
    assert "expect_column_distinct_values_to_contain_set(source): observed missing ['b']" in text
    assert (
        "stage_stats: expect_column_pair_values_a_to_be_greater_than_b(max_removal_rate, removal_rate): "
        "observed 2 of 2 rows unexpected" in text
    )
    assert '"rule": "word_count"' in text and "expected max_removal_rate >= removal_rate on every row" in text
    assert (tmp_path / "docs" / "index.html").is_file()
    with pytest.raises(ExpectationsFailed, match="ingest gate failed 4/") as error:
        outcome.raise_if_failed("ingest")
    assert "index.html" in str(error.value)
    json.dumps(outcome.to_dict())  # the report is JSON


def test_ingest_gate_blocks_the_stage_when_a_source_yields_nothing(tmp_path: Path) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "a.txt").write_text(TEXT)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    config = IngestConfig(
        sources=[
            SourceConfig(name="good", kind="prose", format="files", path=str(tmp_path / "good")),
            SourceConfig(name="empty", kind="prose", format="files", path=str(tmp_path / "empty")),
        ]
    )
    repo = open_repo(str(tmp_path / "repo"))
    repo.create_branch("curate-g", "main")
    before = repo.resolve("curate-g")
    with pytest.raises(
        ExpectationsFailed,
        match=r"expect_column_distinct_values_to_contain_set\(source\): observed missing \['empty'\]",
    ):
        run_stage(run_ingest, repo, "curate-g", before, config)
    assert repo.resolve("curate-g") == before  # nothing committed
    report = json.loads(repo.get("curate-g", "reports/ingest.json"))  # left staged for a person to read
    assert report["expectations"]["success"] is False


def test_validate_gate_blocks_the_stage_when_a_filter_removes_too_much(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for i in range(4):
        (tmp_path / "docs" / f"long{i}.txt").write_text(f"{TEXT} {i}")
    (tmp_path / "docs" / "short.txt").write_text("Only a few words here.")
    repo = open_repo(str(tmp_path / "repo"))
    repo.create_branch("curate-v", "main")
    ingested = run_stage(
        run_ingest,
        repo,
        "curate-v",
        repo.resolve("curate-v"),
        IngestConfig(
            sources=[SourceConfig(name="docs", kind="prose", format="files", path=str(tmp_path / "docs"))]
        ),
    )
    only_word_count = {
        "prose": dict.fromkeys(PROSE_RULES, {}) | {"word_count": {"min": 6}},
        "langid": {"enabled": False},
    }
    lenient = ValidateConfig.model_validate(only_word_count)
    tight = ValidateConfig.model_validate(
        only_word_count | {"gate": {"removal_rate": {"word_count": {"max": 0.1}}}}
    )
    with pytest.raises(ExpectationsFailed) as error:
        run_stage(run_validate, repo, "curate-v", ingested.commit_id, tight)
    message = str(error.value)
    assert "validate gate failed 1/" in message
    assert "expect_column_pair_values_a_to_be_greater_than_b(max_removal_rate, removal_rate)" in message
    assert '"rule": "word_count"' in message and '"removal_rate": 0.2' in message
    assert repo.resolve("curate-v") == ingested.commit_id

    passed = run_stage(run_validate, repo, "curate-v", ingested.commit_id, lenient)
    assert passed.report["expectations"]["success"] is True
    assert repo.get_commit(passed.commit_id).metadata["gate"] == "passed"


def _docs(repo, ref: str, stage: str) -> dict[str, str]:
    prefix = f"reports/data_docs/{stage}/"
    pages = [s.path for s in repo.list(ref, prefix) if s.path.endswith(".html")]
    return {p.removeprefix(prefix): repo.get(ref, p).decode() for p in pages}


def test_a_gate_on_a_sample_says_so_in_the_report_the_commit_and_the_data_docs(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for i in range(5):
        (tmp_path / "docs" / f"d{i}.txt").write_text(f"{TEXT} {i}")
    repo = open_repo(str(tmp_path / "repo"))
    repo.create_branch("curate-s", "main")
    base = repo.resolve("curate-s")
    source = SourceConfig(name="docs", kind="prose", format="files", path=str(tmp_path / "docs"))
    sampled = run_stage(
        run_ingest, repo, "curate-s", base, IngestConfig(sources=[source], gate={"max_rows": 2})
    )

    gate = sampled.report["expectations"]
    run_name = f"ingest-{base[:12]}-sample-2-of-5"
    assert (gate["sampled"], gate["documents_checked"], gate["documents_total"]) == (True, 2, 5)
    assert gate["run_name"] == run_name and "a sample of 2 of 5 documents" in gate["summary"]
    assert repo.get_commit(sampled.commit_id).metadata["gate_run"] == run_name
    pages = _docs(repo, sampled.commit_id, "ingest")
    assert run_name in pages["index.html"], "the Data Docs index lists the run by its name"
    (validation,) = [p for p in pages if p.startswith("validations/raw_documents/")]
    assert validation.startswith(f"validations/raw_documents/{run_name}/") and run_name in pages[validation]
    assert "checked a sample of 2 of 5 documents" in pages["expectations/raw_documents.html"]
    assert not any("__none__" in p for p in pages), "every run is filed under its name"

    repo.create_branch("curate-a", "main")
    whole = run_stage(run_ingest, repo, "curate-a", base, IngestConfig(sources=[source]))
    assert whole.report["expectations"]["sampled"] is False
    assert whole.report["expectations"]["run_name"] == f"ingest-{base[:12]}-all-5"
    assert (
        "checked all 5 documents" in _docs(repo, whole.commit_id, "ingest")["expectations/raw_documents.html"]
    )


def test_data_docs_render_offline_with_local_bootstrap_and_jquery(tmp_path: Path) -> None:
    """No page loads anything from the network; every local stylesheet, script and image it names is there."""
    import re

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.txt").write_text(TEXT)
    repo = open_repo(str(tmp_path / "repo"))
    repo.create_branch("curate-o", "main")
    source = SourceConfig(name="docs", kind="prose", format="files", path=str(tmp_path / "docs"))
    result = run_stage(run_ingest, repo, "curate-o", repo.resolve("curate-o"), IngestConfig(sources=[source]))
    prefix = "reports/data_docs/ingest/"
    files = {s.path.removeprefix(prefix) for s in repo.list(result.commit_id, prefix)}
    pages = _docs(repo, result.commit_id, "ingest")
    assert {"static/vendor/bootstrap.min.css", "static/vendor/jquery.min.js"} <= files
    for name, html in pages.items():
        loads = re.findall(r"""<(?:link|script|img)\b[^>]*(?:href|src)=["']([^"'#]+)["']""", html)
        assert not [url for url in loads if re.match(r"https?://", url)], f"{name} loads from the network"
        assert any(url.endswith("static/vendor/bootstrap.min.css") for url in loads), name
        for url in loads:
            assert os.path.normpath(Path(name).parent / url) in files, (
                f"{name} loads {url}, not in the Data Docs"
            )


def test_vendored_bootstrap_table_is_the_npm_package_unchanged() -> None:
    """tasks/vendor holds bootstrap-table 1.19.1's files exactly as its npm package ships them."""
    import hashlib

    from tasks.vendor import BOOTSTRAP_TABLE, SHA256

    files = {p.relative_to(BOOTSTRAP_TABLE).as_posix() for p in BOOTSTRAP_TABLE.rglob("*") if p.is_file()}
    assert files == set(SHA256)
    for name, digest in SHA256.items():
        assert hashlib.sha256((BOOTSTRAP_TABLE / name).read_bytes()).hexdigest() == digest, name
