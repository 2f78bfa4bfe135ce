"""Dedup quality, measured: near-duplicates planted at known Jaccard similarities, true pairs
by brute force over all pairs, recall and precision of the default configuration, and
incremental dedup against deduplicating the union at once."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from scipy.sparse import csr_matrix

from tasks.dedup import DedupConfig, PublishedIndex, plan_dedup
from tasks.dedup.plan import keys_from_arrow
from tasks.schema import document_id

WORD = re.compile(r"[0-9a-z_]+")
NGRAM = 5


@dataclass
class Corpus:
    table: pa.Table
    planted: list[tuple[int, int, float]]  # (base row, variant row, target Jaccard)


def planted_corpus(seed: int, bases: int = 500, unrelated: int = 200) -> Corpus:
    """Random documents; each base gets one variant at a target Jaccard in [0.5, 0.95].

    A variant replaces ``m`` consecutive words of its base: that changes the ``m + 4``
    5-gram shingles touching the block, so J = (S - m - 4) / (S + m + 4) for S shingles,
    and ``m`` is solved from the target.
    """
    rng = np.random.default_rng(seed)
    letters = rng.integers(ord("a"), ord("z") + 1, size=(30_000, 7), dtype=np.uint8)
    vocabulary = np.array([row.tobytes().decode() for row in letters])
    texts: list[str] = []
    planted = []
    for _ in range(bases):
        words = list(vocabulary[rng.integers(0, len(vocabulary), int(rng.integers(120, 400)))])
        target = float(rng.uniform(0.5, 0.95))
        shingles = len(words) - NGRAM + 1
        block = max(1, round((shingles * (1 - target) - (NGRAM - 1) * (1 + target)) / (1 + target)))
        start = int(rng.integers(0, len(words) - block))
        variant = list(words)
        variant[start : start + block] = vocabulary[rng.integers(0, len(vocabulary), block)]
        texts += [" ".join(words), " ".join(variant)]
        planted.append((len(texts) - 2, len(texts) - 1, target))
    for _ in range(unrelated):
        texts.append(" ".join(vocabulary[rng.integers(0, len(vocabulary), int(rng.integers(20, 400)))]))
    order = rng.permutation(len(texts))  # interleave, so nothing hinges on input order
    rank = np.argsort(order)
    table = documents([texts[i] for i in order], source="web")
    return Corpus(table, [(int(rank[a]), int(rank[b]), t) for a, b, t in planted])


def documents(texts: list[str], source: str, quality: list[float] | None = None, first: int = 0) -> pa.Table:
    locators = [f"{source}/doc-{first + i:05d}.txt" for i in range(len(texts))]
    columns = {
        "id": [document_id(source, loc) for loc in locators],
        "source": [source] * len(texts),
        "text": texts,
        "locator": locators,
        "meta": ["{}"] * len(texts),
    }
    if quality is not None:
        columns["quality_score"] = quality
    return pa.table(columns)


def true_jaccard(texts: list[str]) -> np.ndarray:
    """Exact Jaccard of every pair of 5-gram shingle sets (brute force, via a sparse product)."""
    vocabulary: dict[tuple[str, ...], int] = {}
    rows, cols = [], []
    for i, text in enumerate(texts):
        words = WORD.findall(text.lower())
        shingles = {tuple(words[k : k + NGRAM]) for k in range(len(words) - NGRAM + 1)} or {tuple(words)}
        for s in shingles:
            rows.append(i)
            cols.append(vocabulary.setdefault(s, len(vocabulary)))
    incidence = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(texts), len(vocabulary)))
    intersection = (incidence @ incidence.T).toarray()
    sizes = np.diag(intersection)
    union = sizes[:, None] + sizes[None, :] - intersection
    return intersection / np.maximum(union, 1)


def same_cluster(plan, ids: list[str]) -> dict[str, str]:
    cluster = dict(
        zip(plan.clusters.column("id").to_pylist(), plan.clusters.column("cluster").to_pylist(), strict=True)
    )
    return {i: cluster[i] for i in ids}


def test_recall_and_precision_at_known_similarities():
    corpus = planted_corpus(seed=11)
    texts = corpus.table.column("text").to_pylist()
    ids = corpus.table.column("id").to_pylist()
    jaccard = true_jaccard(texts)
    planted_j = np.array([jaccard[a, b] for a, b, _ in corpus.planted])
    assert planted_j.min() < 0.55 and planted_j.max() > 0.93, "planted similarities span 0.5 to 0.95"

    config = DedupConfig()
    plan = plan_dedup([corpus.table.slice(0, 500), corpus.table.slice(500)], config)
    cluster = same_cluster(plan, ids)
    upper = np.triu(np.ones_like(jaccard, bool), 1)
    a, b = np.nonzero(upper & (jaccard >= config.threshold + 0.05))
    found = np.array([cluster[ids[i]] == cluster[ids[j]] for i, j in zip(a, b, strict=True)])
    recall = found.mean()

    position = {doc_id: k for k, doc_id in enumerate(ids)}
    reported = [
        jaccard[position[x], position[y]]
        for x, y in zip(
            plan.similar_pairs.column("id_a").to_pylist(),
            plan.similar_pairs.column("id_b").to_pylist(),
            strict=True,
        )
    ]
    precision = np.mean(np.array(reported) > config.threshold - 0.1)
    far = np.argwhere(upper & (jaccard <= config.threshold - 0.1) & (jaccard >= 0.4))
    wrongly_merged = np.mean([cluster[ids[i]] == cluster[ids[j]] for i, j in far])

    print(
        f"recall {recall:.3f} over {len(a)} pairs; precision {precision:.3f} over {len(reported)} reported pairs"
    )
    assert len(a) >= 100 and len(far) >= 200, "enough planted pairs on both sides of the threshold"
    assert recall >= 0.95
    assert precision >= 0.95
    assert wrongly_merged <= 0.05


def test_removed_documents_duplicate_a_kept_one_of_their_cluster():
    corpus = planted_corpus(seed=5, bases=60, unrelated=20)
    plan = plan_dedup([corpus.table], DedupConfig())
    ids = np.array(corpus.table.column("id").to_pylist(), object)
    kept = set(ids[~plan.removed])
    assert set(plan.duplicate_of[plan.removed]) <= kept
    assert np.all(plan.dup_cluster[plan.removed] == plan.duplicate_of[plan.removed])
    assert plan.removed.sum() > 0 and set(plan.reason[plan.removed]) == {"near_duplicate"}
    # every cluster keeps exactly one document
    assert len(set(plan.dup_cluster)) == (~plan.removed).sum()


def index_of(plan, num_perm: int) -> PublishedIndex:
    """What a published run leaves in the index, read back like the stage reads it."""
    entries = plan.index_entries
    return PublishedIndex(
        ids=np.array(entries.column("id").to_pylist(), object),
        sources=np.array(entries.column("source").to_pylist(), object),
        content_keys=keys_from_arrow(entries.column("content_key")),
        quality=entries.column("quality").to_numpy(),
        signatures=entries.column("signature").combine_chunks().flatten().to_numpy().reshape(-1, num_perm),
    )


def partition(plan, ids: list[str]) -> set[frozenset[str]]:
    cluster = same_cluster(plan, ids)
    groups: dict[str, set[str]] = {}
    for doc_id in ids:
        groups.setdefault(cluster[doc_id], set()).add(doc_id)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("reingest", [False, True], ids=["append-only", "full-reingest"])
def test_incremental_dedup_finds_the_clusters_of_the_union(reingest):
    corpus = planted_corpus(seed=3, bases=120, unrelated=60)
    # exact copies too, some across the two versions
    table = pa.concat_tables(
        [corpus.table, documents(corpus.table.column("text").to_pylist()[:40:3], "copies")]
    )
    ids = table.column("id").to_pylist()
    first, second = table.slice(0, 200), table.slice(200)
    config = DedupConfig()

    union = plan_dedup([table], config)
    v1 = plan_dedup([first], config)
    v2 = plan_dedup([table] if reingest else [second], config, index_of(v1, config.num_perm))

    assert partition(v2, ids) == partition(union, ids)
    assert v2.stats["contents_hashed"] < second.num_rows, "earlier documents are not hashed again"
    assert v2.stats["published_in_input"] == (first.num_rows if reingest else 0)
    # published documents keep their place: whatever v1 kept, v2 does not remove
    kept_in_v1 = set(np.array(first.column("id").to_pylist(), object)[~v1.removed])
    if reingest:
        removed_in_v2 = set(np.array(ids, object)[v2.removed])
        assert not kept_in_v1 & removed_in_v2


def test_a_published_document_stays_the_representative_even_against_better_quality():
    corpus = planted_corpus(seed=8, bases=3, unrelated=0)
    texts = corpus.table.column("text").to_pylist()
    base, variant, _ = corpus.planted[0]
    v1 = documents([texts[base]], "web", quality=[0.1])
    v2 = documents([texts[variant]], "web", quality=[0.9], first=1)
    config = DedupConfig(threshold=0.5)  # the planted variant is at least 0.5 similar
    published = plan_dedup([v1], config)
    incremental = plan_dedup([v2], config, index_of(published, config.num_perm))
    assert incremental.removed.tolist() == [True]
    assert incremental.duplicate_of[0] == v1.column("id")[0].as_py()
    assert incremental.cluster_size.tolist() == [2]
    together = plan_dedup([v1, v2], config)  # without history, quality decides
    assert together.removed.tolist() == [True, False]
