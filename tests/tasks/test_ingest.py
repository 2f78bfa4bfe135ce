"""Ingest: normalisation, ids and locators, partitions, fail-fast configuration, and the stage
on a real LocalRepo (parts, quarantine, report, commit metadata, gate, re-run)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from tasks.ingest import (
    IngestConfig,
    SourceConfig,
    ingest_partition,
    plan_partitions,
    run_ingest,
)
from tasks.ingest.normalize import normalize_texts
from tasks.ingest.task import ingest_task
from tasks.partition_map import PartitionFailed, use, with_retries
from tasks.parts import read_parts
from tasks.schema import DOCUMENT_SCHEMA, document_id
from tasks.stage import ConfigError, run_stage
from versioning import open_repo

TEXT = "Plain prose for the ingest tests, long enough to be kept.\n"


def _all(source: SourceConfig, config: IngestConfig) -> tuple[pa.Table, pa.Table, int]:
    partitions = plan_partitions(source, config)
    tables = [ingest_partition(source, p, config) for p in partitions]
    return pa.concat_tables([t[0] for t in tables]), pa.concat_tables([t[1] for t in tables]), len(partitions)


def test_normalisation_bom_line_endings_controls_nfc() -> None:
    texts = pa.array(["\ufeffa\r\nb\rc\u2028d", "e\u0301\x00\x1b[0m\x7f", "tab\tstays\n", "\ufeff"])
    assert normalize_texts(texts).to_pylist() == ["a\nb\nc\nd", "é[0m", "tab\tstays\n", ""]


def test_ids_are_stable_hashes_of_source_and_locator(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text(TEXT)
    source = SourceConfig(name="s", kind="prose", format="files", path=str(tmp_path))
    kept, _, _ = _all(source, IngestConfig(sources=[source]))
    assert kept.schema == DOCUMENT_SCHEMA
    assert kept.to_pylist() == [
        {
            "id": document_id("s", "d/x.txt"),
            "source": "s",
            "text": TEXT,
            "locator": "d/x.txt",
            "meta": json.dumps({"kind": "prose", "format": "files"}),
        }
    ]


def test_globs_select_files_and_skip_excluded_folders(tmp_path: Path) -> None:
    for rel in ["a.py", "pkg/b.py", "pkg/c.txt", "pkg/__pycache__/b.cpython.py", "build/d.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    source = SourceConfig(
        name="c",
        kind="code",
        format="files",
        path=str(tmp_path),
        include=["*.py"],
        exclude=["build/*", "*/__pycache__/*"],
    )
    kept, _, _ = _all(source, IngestConfig(sources=[source]))
    assert kept.column("locator").to_pylist() == ["a.py", "pkg/b.py"]


def test_jsonl_byte_ranges_give_the_same_documents_and_line_numbers(tmp_path: Path) -> None:
    lines = [orjson.dumps({"text": f"{TEXT} {i}", "n": i}) for i in range(300)]
    lines[150] = b"{broken"
    (tmp_path / "data.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    source = SourceConfig(name="j", kind="prose", format="jsonl", path=str(tmp_path / "data.jsonl"))
    whole_kept, whole_q, whole_n = _all(source, IngestConfig(sources=[source]))
    split_kept, split_q, split_n = _all(source, IngestConfig(sources=[source], partition_bytes=1000))
    assert whole_n == 1 and split_n > 10
    assert split_kept.equals(whole_kept) and split_q.equals(whole_q)
    assert whole_q.column("locator").to_pylist() == ["data.jsonl:151"]
    assert whole_kept.column("locator")[200].as_py() == "data.jsonl:202"
    assert whole_kept.column("text")[200].as_py().endswith(" 201")


def test_parquet_row_group_partitions_and_id_field(tmp_path: Path) -> None:
    table = pa.table({"body": [f"{TEXT} {i}" for i in range(100)], "key": [f"k{i}" for i in range(100)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    source = SourceConfig(
        name="p", kind="prose", format="parquet", path=str(tmp_path), text_field="body", id_field="key"
    )
    kept, quarantined, n = _all(source, IngestConfig(sources=[source], partition_bytes=1))
    assert n == 10 and quarantined.num_rows == 0
    assert kept.column("locator").to_pylist() == [f"t.parquet:{i}" for i in range(100)]
    assert kept.column("id").to_pylist() == [document_id("p", f"k{i}") for i in range(100)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"path": "/no/such/dir"}, "does not exist"),
        ({"include": ["*.nothing"]}, "no file under"),
        ({"text_field": "txt"}, "no record has the key 'txt'"),
    ],
)
def test_misconfigured_source_fails_before_any_work(tmp_path: Path, change: dict, message: str) -> None:
    (tmp_path / "a.jsonl").write_bytes(orjson.dumps({"text": TEXT, "url": "u"}) + b"\n")
    source = SourceConfig(
        **({"name": "j", "kind": "prose", "format": "jsonl", "path": str(tmp_path)} | change)
    )
    with pytest.raises(ConfigError, match=message) as error:
        plan_partitions(source, IngestConfig(sources=[source]))
    assert "'j'" in str(error.value)


def test_invalid_config_values_name_the_field() -> None:
    with pytest.raises(ValidationError, match="kind"):
        SourceConfig(name="x", kind="poetry", format="files", path=".")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SourceConfig(name="x", kind="prose", format="files", path=".", text_feild="t")
    with pytest.raises(ValidationError, match="name"):
        SourceConfig(name="Bad/Name", kind="prose", format="files", path=".")
    with pytest.raises(ValidationError, match="unique"):
        IngestConfig(sources=[SourceConfig(name="a", kind="prose", format="files", path=".")] * 2)


def test_worker_processes_give_the_same_parts_as_one_process(tmp_path: Path, prefect_harness) -> None:
    from prefect.task_runners import ProcessPoolTaskRunner

    from tasks.partition_task import OnTaskRunner

    (tmp_path / "src").mkdir()
    for i in range(40):
        (tmp_path / "src" / f"f{i:02d}.txt").write_text(f"{TEXT} {i}")
    source = SourceConfig(name="f", kind="prose", format="files", path=str(tmp_path / "src"))
    config = IngestConfig(sources=[source], max_files_per_partition=5)
    assert len(plan_partitions(source, config)) == 8
    contents = []
    for name, runner in [("inline", None), ("pooled", ProcessPoolTaskRunner(max_workers=2))]:
        repo = open_repo(str(tmp_path / f"repo-{name}"))
        if runner is None:
            result = run_stage(run_ingest, repo, "main", repo.resolve("main"), config)
        else:
            with runner, use(OnTaskRunner(runner)):
                result = run_stage(run_ingest, repo, "main", repo.resolve("main"), config)
        paths = [o.path for o in repo.list(result.commit_id, "raw/")]
        contents.append({p: repo.get(result.commit_id, p) for p in paths})
        assert result.report["kept"] == 40
    assert list(contents[0]) == [f"raw/f/part-{i:05d}.parquet" for i in range(8)], "one part per partition"
    assert contents[0] == contents[1], "the same bytes from one process and from two worker processes"


def test_a_failing_partition_is_retried_alone_then_fails_with_its_name() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("storage hiccup")
        return "done"

    assert with_retries(flaky, retries=2, what="partition 3", backoff_seconds=0) == "done" and len(calls) == 3
    with pytest.raises(PartitionFailed, match="partition 4 failed 2 time"):
        with_retries(lambda: 1 / 0, retries=1, what="partition 4", backoff_seconds=0)


@pytest.fixture
def sources(tmp_path: Path) -> list[SourceConfig]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(7):
        (docs / f"d{i}.md").write_text(f"{TEXT} number {i}")
    (docs / "empty.md").write_text("")
    (tmp_path / "lines.jsonl").write_bytes(
        b"".join(orjson.dumps({"text": f"{TEXT} {i}"}) + b"\n" for i in range(5)) + b"oops\n"
    )
    return [
        SourceConfig(name="docs", kind="prose", format="files", path=str(docs)),
        SourceConfig(
            name="lines", kind="prose", format="jsonl", path=str(tmp_path / "lines.jsonl"), reference=True
        ),
    ]


def test_ingest_stage_writes_parts_quarantine_report_and_commit(
    tmp_path: Path, sources: list[SourceConfig]
) -> None:
    repo = open_repo(str(tmp_path / "repo"))
    repo.create_branch("curate-a", "main")
    base = repo.resolve("curate-a")
    config = IngestConfig(
        sources=sources, max_files_per_partition=3, partition_bytes=250
    )  # one part per partition

    result = ingest_task.fn(str(tmp_path / "repo"), "curate-a", config, base, "run-1")

    paths = [o.path for o in repo.list(result.commit_id)]
    assert [p for p in paths if p.startswith("raw/")] == [
        "raw/docs/part-00000.parquet",
        "raw/docs/part-00001.parquet",
        "raw/docs/part-00002.parquet",
        "raw/lines/part-00000.parquet",
        "raw/lines/part-00001.parquet",
    ]
    assert "quarantine/ingest/docs/part-00002.parquet" in paths, (
        "named after its partition, like the kept part"
    )
    assert "reports/data_docs/ingest/index.html" in paths
    raw = pa.concat_tables(read_parts(repo, result.commit_id, "raw/docs"))
    assert raw.num_rows == 7 and raw.schema == DOCUMENT_SCHEMA
    report = json.loads(repo.get(result.commit_id, "reports/ingest.json"))
    assert (report["documents_in"], report["kept"], report["rejected"]) == (
        14,
        12,
        {"empty": 1, "malformed_jsonl": 1},
    )
    assert report["per_source"]["lines"]["reference"] is True
    assert report["expectations"]["success"] is True
    meta = repo.get_commit(result.commit_id).metadata
    assert meta["stage"] == "ingest" and meta["input_commit"] == base and meta["flow_run_id"] == "run-1"
    assert meta["gate"] == "passed" and meta["gate_summary"].startswith("passed")

    # a re-run on the same branch replaces the outputs instead of adding to them
    again = run_stage(run_ingest, repo, "curate-a", result.commit_id, IngestConfig(sources=sources))
    assert [o.path for o in repo.list(again.commit_id, "raw/")] == [
        "raw/docs/part-00000.parquet",
        "raw/lines/part-00000.parquet",
    ]
