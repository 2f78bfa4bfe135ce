"""The dedup stage over a real local repository: outputs, quarantine, report, commit, the
incremental index across published versions, re-runs, determinism and bad input."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.dedup import DedupConfig
from tasks.dedup.index import load_published, run_folders
from tasks.dedup.stage import run_dedup
from tasks.dedup.task import dedup_task
from tasks.parts import list_parts, read_parts
from tasks.stage import run_stage
from tasks.stage_task import stage_table
from tests.tasks.test_dedup_quality import documents
from versioning import DataRepo
from versioning.local import LocalRepo

RNG = np.random.default_rng(42)
VOCABULARY = [f"w{i}x" for i in range(20_000)]


def text(words: int = 150) -> str:
    return " ".join(VOCABULARY[i] for i in RNG.integers(0, len(VOCABULARY), words))


def near_copy(original: str, changed: int = 2) -> str:
    words = original.split()
    for k in range(changed):
        words[10 + 40 * k] = f"edit{k}"
    return " ".join(words)


def put_filtered(repo: DataRepo, branch: str, parts: dict[str, list[pa.Table]], message: str) -> str:
    for prefix in ("filtered/",):
        for stat in list(repo.list(branch, prefix)):
            repo.delete(branch, stat.path)
    for source, tables in parts.items():
        for i, table in enumerate(tables):
            buffer = io.BytesIO()
            pq.write_table(table, buffer)
            repo.put(branch, f"filtered/{source}/part-{i:05d}.parquet", buffer.getvalue())
    return repo.commit(branch, message, {"stage": "validate"}, allow_empty=True).id  # as stages commit


def read_all(repo: DataRepo, ref: str, prefix: str) -> pa.Table:
    tables = list(read_parts(repo, ref, prefix))
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})


def rows_by_id(table: pa.Table, *columns: str) -> dict[str, tuple]:
    values = [table.column(c).to_pylist() for c in columns]
    return {row[0]: tuple(row[1:]) for row in zip(table.column("id").to_pylist(), *values, strict=True)}


@pytest.fixture
def repo(tmp_path) -> DataRepo:
    created = LocalRepo(tmp_path / "repo")
    created.ensure()
    yield created
    created.close()


def web_and_code() -> tuple[dict[str, list[pa.Table]], dict[str, str]]:
    a, b, c = text(), text(), text()
    web = documents([a, near_copy(a), b, "  " + b + "\n", text()], "web")
    code = documents([b, c, near_copy(c, 1), text()], "code")
    names = dict(zip(["a", "a_near", "b", "b_ws", "web_other"], web.column("id").to_pylist(), strict=True))
    names |= dict(zip(["b_code", "c", "c_near", "code_other"], code.column("id").to_pylist(), strict=True))
    return {"web": [web.slice(0, 3), web.slice(3)], "code": [code]}, names


def test_stage_writes_survivors_quarantine_report_index_and_one_commit(repo, tmp_path):
    parts, name = web_and_code()
    put_filtered(repo, "main", parts, "validated")
    repo.create_branch("curate-1", "main")
    input_commit = repo.resolve("curate-1")

    result = dedup_task.fn(str(tmp_path / "repo"), "curate-1", DedupConfig(), input_commit, "flow-run-1")

    kept = read_all(repo, result.commit_id, "dedup")
    quarantined = read_all(repo, result.commit_id, "quarantine/dedup")
    clusters = [("a", "a_near"), ("b", "b_ws", "b_code"), ("c", "c_near"), ("web_other",), ("code_other",)]
    survivors = {min(name[k] for k in cluster): cluster for cluster in clusters}  # no quality: smallest id
    assert sorted(kept.column("id").to_pylist()) == sorted(survivors)
    assert set(kept.column_names) >= {
        "id",
        "source",
        "text",
        "locator",
        "meta",
        "dup_cluster",
        "cluster_size",
        "weight",
    }
    assert set(quarantined.column_names) >= {
        "id",
        "text",
        "locator",
        "stage",
        "reason",
        "duplicate_of",
        "dup_cluster",
    }
    why = rows_by_id(quarantined, "reason", "duplicate_of", "stage")
    sizes = rows_by_id(kept, "cluster_size", "dup_cluster", "weight")
    for survivor, cluster in survivors.items():
        assert sizes[survivor] == (len(cluster), survivor, 1.0)
        for member in {name[k] for k in cluster} - {survivor}:
            same_text = {member, survivor} <= {name["b"], name["b_ws"], name["b_code"]}
            assert why[member] == ("exact_duplicate" if same_text else "near_duplicate", survivor, "dedup")

    report = json.loads(repo.get(result.commit_id, "reports/dedup.json"))
    assert report["documents_in"] == 9 and report["kept"] == 5
    assert report["rejected"] == {"exact_duplicate": 2, "near_duplicate": 2}
    assert sum(s["documents_in"] for s in report["per_source"].values()) == 9
    commit = repo.get_commit(result.commit_id)
    assert commit.metadata["stage"] == "dedup" and commit.metadata["input_commit"] == input_commit
    assert commit.metadata["flow_run_id"] == "flow-run-1"
    assert {row["source"] for row in stage_table(result.report)} == {"web", "code", "(all)"}

    (folder,) = run_folders(repo, result.commit_id, DedupConfig())
    assert folder.endswith(input_commit[:16])
    documents_written = read_all(repo, result.commit_id, f"{folder}/documents")
    contents_written = read_all(repo, result.commit_id, f"{folder}/contents")
    assert documents_written.num_rows == 9, "every new document, bucketed by id"
    assert contents_written.num_rows == 7, (
        "every new text once (b, b_ws and b_code share one), bucketed by content"
    )
    assert contents_written.schema.field("signature").type.list_size == 256
    assert json.loads(repo.get(result.commit_id, f"{folder}/run.json"))["buckets"] == DedupConfig().buckets
    assert not list(repo.list(result.commit_id, "_scratch/")), "the shuffle's scratch files are not committed"


def test_a_new_version_is_deduplicated_against_published_ones_without_rehashing(repo, tmp_path):
    parts, name = web_and_code()
    put_filtered(repo, "main", parts, "v1 validated")
    repo.create_branch("curate-1", "main")
    first = run_stage(run_dedup, repo, "curate-1", repo.resolve("curate-1"), DedupConfig())
    repo.merge("curate-1", "main", "publish v1")

    # an unpublished run on another branch must not count as published
    repo.create_branch("curate-failed", "main")
    put_filtered(repo, "curate-failed", {"web": [documents([text()], "web", first=900)]}, "never published")
    run_stage(run_dedup, repo, "curate-failed", repo.resolve("curate-failed"), DedupConfig())

    repo.create_branch("curate-2", "main")
    v1_web = parts["web"][0].column("text").to_pylist()
    v2 = documents([near_copy(v1_web[0], 1), v1_web[2], text(), text()], "web", first=100)
    input_commit = put_filtered(repo, "curate-2", {"web": [v2]}, "v2 validated (new documents only)")
    second = run_stage(run_dedup, repo, "curate-2", input_commit, DedupConfig())

    extra = second.report["extra"]
    assert extra["published_documents"] == 9, "v1's entries, not the failed branch's"
    assert extra["contents_hashed"] == 3, "the exact copy of a published text needs no signature"
    why = rows_by_id(read_all(repo, second.commit_id, "quarantine/dedup"), "reason", "duplicate_of")
    v2_ids = v2.column("id").to_pylist()
    assert why[v2_ids[0]] == ("near_duplicate", name["a"])
    assert why[v2_ids[1]][0] == "exact_duplicate" and why[v2_ids[1]][1] in {name["b"], name["b_code"]}
    assert len(run_folders(repo, second.commit_id, DedupConfig())) == 2
    assert first.report["extra"]["index_entries_written"] == 9
    assert extra["index_entries_written"] == 4


def test_stored_band_keys_are_used_and_a_new_banding_recomputes_them(repo):
    parts, _ = web_and_code()
    put_filtered(repo, "main", parts, "validated")
    result = run_stage(run_dedup, repo, "main", repo.resolve("main"), DedupConfig())
    same = load_published(repo, result.commit_id, DedupConfig())
    assert same.banding == (28, 9) and same.band_keys.shape == (9, 28)
    put_filtered(repo, "main", {"web": [documents([text()], "web", first=70)]}, "v2")
    reused = run_stage(run_dedup, repo, "main", repo.resolve("main"), DedupConfig())
    assert reused.report["extra"]["band_keys_reused"] == 7, "one per published text"
    # another threshold (so another banding) shares the signatures and still finds the copies
    other = DedupConfig(threshold=0.7)
    v2 = documents([parts["code"][0].column("text").to_pylist()[1]], "code", first=50)
    put_filtered(repo, "main", {"code": [v2]}, "v3")
    again = run_stage(run_dedup, repo, "main", repo.resolve("main"), other)
    assert again.report["extra"]["published_documents"] == 10
    assert again.report["extra"]["band_keys_reused"] == 0
    assert again.report["rejected"] == {"exact_duplicate": 1}, "its published twin is in the index"
    mixed = load_published(repo, again.commit_id, other)
    assert mixed.band_keys is None and len(mixed) == 11


def test_rerunning_on_the_same_branch_replaces_its_outputs(repo):
    parts, _ = web_and_code()
    input_commit = put_filtered(repo, "main", parts, "validated")
    repo.create_branch("curate-1", "main")
    first = run_stage(run_dedup, repo, "curate-1", input_commit, DedupConfig())
    repo.reset_hard("curate-1", input_commit)
    repo.create_branch("curate-2", first.commit_id)
    second = run_stage(run_dedup, repo, "curate-2", input_commit, DedupConfig())  # a retry after a commit
    for prefix in ("dedup", "quarantine/dedup", "index/minhash"):
        assert [s.path for s in repo.list(first.commit_id, prefix)] == [
            s.path for s in repo.list(second.commit_id, prefix)
        ]
        assert read_all(repo, first.commit_id, prefix).equals(read_all(repo, second.commit_id, prefix))


def test_same_documents_same_output_whatever_the_partitioning(tmp_path):
    parts, name = web_and_code()
    clusters = [("a", "a_near"), ("b", "b_ws", "b_code"), ("c", "c_near")]
    survivors = {min(name[k] for k in cluster) for cluster in clusters}  # no quality: smallest id
    planted = {name[k] for cluster in clusters for k in cluster} - survivors
    docs = {s: pa.concat_tables(t) for s, t in parts.items()}
    outputs = []
    for k, split in enumerate([1, 2, 3]):
        repo = LocalRepo(tmp_path / f"repo{k}")
        repo.ensure()
        layout = {s: [t.slice(i, split) for i in range(0, t.num_rows, split)][::-1] for s, t in docs.items()}
        result = run_stage(run_dedup, repo, "main", put_filtered(repo, "main", layout, "v"), DedupConfig())
        kept = read_all(repo, result.commit_id, "dedup")
        quarantined = read_all(repo, result.commit_id, "quarantine/dedup")
        outputs.append(
            (
                rows_by_id(kept, "dup_cluster", "cluster_size"),
                rows_by_id(quarantined, "reason", "duplicate_of"),
            )
        )
        repo.close()
        removed = outputs[-1][1]
        assert set(removed) == planted, f"parts of {split} rows: the planted duplicates go, and only they"
        assert {reason for reason, _ in removed.values()} == {"exact_duplicate", "near_duplicate"}
    assert outputs[0] == outputs[1] == outputs[2]


def test_best_quality_survives_and_soft_mode_keeps_everyone_with_weights(repo):
    a = text()
    table = documents([a, near_copy(a), near_copy(a, 3), text()], "web", quality=[0.2, 0.9, None, 0.5])
    put_filtered(repo, "main", {"web": [table]}, "v")
    ids = table.column("id").to_pylist()
    hard = run_stage(run_dedup, repo, "main", repo.resolve("main"), DedupConfig())
    kept = read_all(repo, hard.commit_id, "dedup")
    assert set(kept.column("id").to_pylist()) == {ids[1], ids[3]}, "the 0.9 document represents its cluster"

    repo.create_branch("soft", put_filtered(repo, "main", {"web": [table]}, "again"))
    soft = run_stage(run_dedup, repo, "soft", repo.resolve("soft"), DedupConfig(mode="soft"))
    weights = rows_by_id(read_all(repo, soft.commit_id, "dedup"), "weight", "cluster_size", "dup_cluster")
    assert weights[ids[0]] == pytest.approx((1 / 3, 3, ids[1])) and weights[ids[3]] == (1.0, 1, ids[3])
    assert list_parts(repo, soft.commit_id, "quarantine/dedup") == []
    assert soft.report["kept"] == 4 and soft.report["rejected"] == {}


def test_bad_input_and_bad_configs_fail_with_one_clear_sentence(repo):
    with pytest.raises(
        ValueError, match="no documents under filtered/ at commit .*; run the validate stage first"
    ):
        run_stage(run_dedup, repo, "main", repo.resolve("main"), DedupConfig())
    put_filtered(repo, "main", {"web": [pa.table({"id": ["x"], "source": ["web"]})]}, "broken")
    with pytest.raises(ValueError, match="lacks column\\(s\\) text"):
        run_stage(run_dedup, repo, "main", repo.resolve("main"), DedupConfig())
    with pytest.raises(ValueError, match="give both bands and rows"):
        DedupConfig(bands=10)
    with pytest.raises(ValueError, match="bands x rows = 300 exceeds num_perm = 256"):
        DedupConfig(bands=10, rows=30)
    with pytest.raises(ValueError, match="extra"):
        DedupConfig(treshold=0.5)
