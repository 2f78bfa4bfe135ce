"""The bucketed dedup (tasks/dedup/shuffle/, what the stage runs) against the in-memory plan
(tasks/dedup/plan.py): the same survivors, reasons, clusters and weights, whatever the bucket
count, also incrementally against published versions and across a change of bucket count."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tasks.dedup import DedupConfig, deduplicate
from tasks.dedup.index import load_published
from tasks.dedup.stage import run_dedup
from tasks.stage import run_stage
from tests.tasks.test_dedup_quality import documents, planted_corpus
from tests.tasks.test_dedup_stage import put_filtered, read_all, rows_by_id
from versioning.local import LocalRepo

KEPT = ("dup_cluster", "cluster_size", "weight")
REMOVED = ("reason", "duplicate_of", "dup_cluster")


def corpus(seed: int) -> dict[str, list[pa.Table]]:
    """Planted near duplicates at known similarities, exact copies (whitespace variants), a text
    copied 12 times (an LSH bucket wider than the window), texts without words, quality with nulls."""
    rng = np.random.default_rng(seed)
    table = planted_corpus(seed, bases=120, unrelated=60).table
    texts = table.column("text").to_pylist()
    copies = [f"  {texts[i]}\n" for i in rng.integers(0, len(texts), 25)]
    wide = [texts[3] + f" tail{k}" for k in range(12)]
    wordless = ["!!! ??? ...", "!!!   ??? ...", "---"]
    all_texts = texts + copies + wide + wordless
    quality = [None if k % 7 == 0 else float(rng.uniform()) for k in range(len(all_texts))]
    web = documents(all_texts[: len(all_texts) // 2], "web", quality[: len(all_texts) // 2])
    code = documents(all_texts[len(all_texts) // 2 :], "code", quality[len(all_texts) // 2 :], first=5000)
    return {
        "web": [web.slice(i, 70) for i in range(0, web.num_rows, 70)],
        "code": [code.slice(i, 90) for i in range(0, code.num_rows, 90)],
    }


def in_memory(parts: dict[str, list[pa.Table]], config: DedupConfig, published=None) -> tuple[dict, dict]:
    tables = [t for source in sorted(parts) for t in parts[source]]  # the stage's input order
    kept, quarantined, _ = deduplicate(tables, config, published)
    return rows_by_id(kept, *KEPT), rows_by_id(quarantined, *REMOVED)


def bucketed(repo: LocalRepo, branch: str, input_commit: str, config: DedupConfig):
    result = run_stage(run_dedup, repo, branch, input_commit, config)
    kept = read_all(repo, result.commit_id, "dedup")
    quarantined = read_all(repo, result.commit_id, "quarantine/dedup")
    removed = rows_by_id(quarantined, *REMOVED) if quarantined.num_rows else {}
    return result, rows_by_id(kept, *KEPT), removed


@pytest.mark.parametrize(
    ("buckets", "slice_bytes"), [(1, 16 << 20), (3, 16 << 20), (8, 16 << 20), (1, 8192), (3, 4096)]
)
def test_the_bucketed_plan_decides_every_row_as_the_in_memory_plan(tmp_path, buckets, slice_bytes):
    parts = corpus(7)
    config = DedupConfig(buckets=buckets, bucket_window=4, slice_bytes=slice_bytes)
    expected_kept, expected_removed = in_memory(parts, config)
    assert {r for r, _, _ in expected_removed.values()} == {"exact_duplicate", "near_duplicate"}
    assert len(expected_removed) > 40

    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    input_commit = put_filtered(repo, "main", parts, "validated")
    result, kept, removed = bucketed(repo, "main", input_commit, config)
    assert kept == expected_kept
    assert removed == expected_removed
    assert result.report["extra"]["buckets"] == buckets
    # contents, pairs, attach and verify visit each bucket once, or in slices when it is larger
    sliced = result.report["extra"]["bucket_slices"]
    assert sliced == 4 * buckets if slice_bytes == 16 << 20 else sliced > 4 * buckets * 3
    repo.close()


def test_soft_mode_weights_match(tmp_path):
    parts = corpus(11)
    config = DedupConfig(buckets=5, mode="soft")
    expected_kept, expected_removed = in_memory(parts, config)
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    _, kept, removed = bucketed(repo, "main", put_filtered(repo, "main", parts, "validated"), config)
    assert removed == expected_removed == {}
    assert kept == expected_kept and any(size > 1 for _, size, _ in kept.values())
    repo.close()


def test_incremental_runs_match_the_in_memory_plan_against_the_published_index(tmp_path):
    v1 = corpus(3)
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.create_branch("curate-1", "main")
    put_filtered(repo, "curate-1", v1, "v1 validated")
    run_stage(run_dedup, repo, "curate-1", repo.resolve("curate-1"), DedupConfig(buckets=4))
    repo.merge("curate-1", "main", "publish v1")

    # v2: v1's web documents again (some with changed text, so their entries are superseded),
    # near copies of v1's code documents under new ids, and new documents
    web = pa.concat_tables(v1["web"])
    texts = web.column("text").to_pylist()
    changed = [t if k % 9 else t + " revised" for k, t in enumerate(texts)]
    v2_web = documents(changed, "web", web.column("quality_score").to_pylist())
    code_texts = pa.concat_tables(v1["code"]).column("text").to_pylist()
    v2_new = documents([t.replace(" ", "  ", 3) + " more" for t in code_texts[:40]] + texts[:5], "news")
    v2 = {"web": [v2_web.slice(0, 100), v2_web.slice(100)], "news": [v2_new]}

    # the same bucket count as v1's index, another (filtered on read), and buckets cut in slices
    for buckets, slice_bytes in ((4, 16 << 20), (6, 16 << 20), (4, 4096)):
        config = DedupConfig(buckets=buckets, slice_bytes=slice_bytes)
        branch = f"curate-2-{buckets}-{slice_bytes}"
        repo.create_branch(branch, "main")
        input_commit = put_filtered(repo, branch, v2, "v2 validated")
        published = load_published(repo, input_commit, config)
        assert len(published) == sum(t.num_rows for ts in v1.values() for t in ts)
        expected_kept, expected_removed = in_memory(v2, config, published)
        result, kept, removed = bucketed(repo, branch, input_commit, config)
        assert kept == expected_kept
        assert removed == expected_removed
        extra = result.report["extra"]
        assert extra["published_in_input"] == sum(1 for k in range(len(texts)) if k % 9)
        assert (
            extra["index_entries_written"] == v2_web.num_rows + v2_new.num_rows - extra["published_in_input"]
        )
