"""Steps 9-10 of the dedup shuffle: each cluster's survivor, each row's decision (step 8, the
clusters, is :mod:`tasks.dedup.shuffle.components`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import layout
from tasks.dedup.index import content_buckets
from tasks.dedup.plan import (
    EXACT,
    NEAR,
    STAGE,
    DedupPlan,
    _best_of_group,
    apply_plan,
    keys_from_arrow,
    keys_to_arrow,
)
from tasks.dedup.shuffle.scratch import (
    DECISIONS,
    DOCS,
    LABELS,
    PARTIALS,
    REPRESENTATIVES,
    Bucket,
    Part,
    ShuffleRun,
)
from tasks.parts import read_part
from tasks.stage import PartitionOutput, write_partition

# ---- 9: survivors -------------------------------------------------------------------------


def _preference(ids: pa.Array | pa.ChunkedArray, quality: np.ndarray, published: np.ndarray) -> tuple:
    """``np.lexsort`` keys of the survivor rule: published first, then quality, then the smallest id."""
    rank = pc.rank(ids, sort_keys="ascending", tiebreaker="first").to_numpy()
    return rank, -quality, ~published


def _labelled(run: ShuffleRun, bucket: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The documents of a content bucket, their content keys and their cluster labels (a content
    linked to no other is its own label)."""
    docs = run.read(run.at("docs", bucket), DOCS)
    keys = keys_from_arrow(docs.column("content_key"))
    labels = run.read(run.at("labels", bucket), LABELS)
    label = keys.copy()
    if labels.num_rows:
        linked = keys_from_arrow(labels.column("content_key"))
        at = np.minimum(np.searchsorted(linked, keys), len(linked) - 1)
        hit = linked[at] == keys
        label[hit] = keys_from_arrow(labels.column("label"))[at[hit]]
    return docs, keys, label


def partials_step(bucket: Bucket) -> dict[str, int]:
    """For each cluster spanning several contents: this bucket's best document and count, to
    the bucket of the cluster's label."""
    run = bucket.run
    docs, keys, label = _labelled(run, bucket.bucket)
    labels = run.read(run.at("labels", bucket.bucket), LABELS)
    linked = np.isin(keys, keys_from_arrow(labels.column("content_key")))
    docs, label = docs.filter(pa.array(linked)), label[linked]
    if docs.num_rows == 0:
        return {}
    group = np.unique(label, return_inverse=True)[1]
    quality = docs.column("quality").to_numpy()
    published = docs.column("published").to_numpy(zero_copy_only=False)
    best = np.unique(_best_of_group(group, _preference(docs.column("id"), quality, published)))
    counts = np.bincount(group)
    partials = pa.table(
        [
            keys_to_arrow(label[best]),
            docs.column("id").take(pa.array(best)),
            pa.array(published[best]),
            pa.array(quality[best]),
            pa.array(counts[group[best]].astype(np.int64)),
            pa.array(np.full(len(best), bucket.bucket, np.int32)),
        ],
        schema=PARTIALS,
    )
    run.scatter("partials", partials, content_buckets(label[best], run.buckets), bucket.producer)
    return {}


def representatives_step(bucket: Bucket) -> dict[str, int]:
    """The survivor and size of every cluster whose label is in this bucket, to each bucket that
    holds some of its contents (the buckets its partials came from)."""
    run = bucket.run
    partials = run.read(run.at("partials", bucket.bucket), PARTIALS)
    if partials.num_rows == 0:
        return {"linked_clusters": 0}
    label = keys_from_arrow(partials.column("label"))
    names, group = np.unique(label, return_inverse=True)
    quality = partials.column("quality").to_numpy()
    published = partials.column("published").to_numpy(zero_copy_only=False)
    best = _best_of_group(group, _preference(partials.column("id"), quality, published))
    size = np.bincount(group, weights=partials.column("count").to_numpy()).astype(np.int64)
    best_row = np.zeros(len(names), np.int64)
    best_row[group] = best
    # one row per partial: each sending bucket gets the clusters it sent, once each
    representatives = pa.table(
        [
            partials.column("label"),
            partials.column("id").take(pa.array(best_row[group])),
            pa.array(size[group]),
        ],
        schema=REPRESENTATIVES,
    )
    run.scatter(
        "representatives",
        representatives,
        partials.column("bucket").to_numpy().astype(np.int64),
        bucket.producer,
    )
    return {"linked_clusters": len(names)}


def decide_step(bucket: Bucket) -> dict[str, int]:
    """Every input row of this content bucket: kept or removed, why, and its cluster."""
    run, config = bucket.run, bucket.run.config
    docs, keys, label = _labelled(run, bucket.bucket)
    if docs.num_rows == 0:
        return {"clusters_with_duplicates": 0}
    labels = run.read(run.at("labels", bucket.bucket), LABELS)
    reps = run.read(run.at("representatives", bucket.bucket), REPRESENTATIVES)
    contents, content_of = np.unique(keys, return_inverse=True)
    ids = docs.column("id")
    id_values = ids.to_numpy(zero_copy_only=False).astype(object)
    quality = docs.column("quality").to_numpy()
    published = docs.column("published").to_numpy(zero_copy_only=False)
    best_with_text = _best_of_group(content_of, _preference(ids, quality, published))
    representative = id_values[best_with_text].copy()
    size = np.bincount(content_of)[content_of]
    in_cluster = np.isin(keys, keys_from_arrow(labels.column("content_key")))
    if in_cluster.any():
        names = keys_from_arrow(reps.column("label"))
        order = np.argsort(names)
        names = names[order]
        at = np.minimum(np.searchsorted(names, label[in_cluster]), max(len(names) - 1, 0))
        if len(names) == 0 or not (names[at] == label[in_cluster]).all():
            raise AssertionError(
                "a linked content's cluster has no survivor: a bucket's partials are missing"
            )
        rep_name = np.array(reps.column("representative").to_pylist(), object)[order]
        representative[in_cluster] = rep_name[at]
        size[in_cluster] = reps.column("size").to_numpy()[order][at]
    linked = np.zeros(len(contents), bool)
    linked[content_of[in_cluster]] = True
    # a cluster of one content is counted here; one of several contents by representatives_step
    duplicates_here = int(np.count_nonzero((np.bincount(content_of) > 1) & ~linked))

    inputs = np.flatnonzero(docs.column("part").to_numpy() >= 0)
    survivor = (representative[inputs] == id_values[inputs]) | (config.mode == "soft")
    exact = best_with_text[inputs] != inputs
    reason = np.where(survivor, None, np.where(exact, EXACT, NEAR)).astype(object)
    duplicate_of = np.where(exact, id_values[best_with_text[inputs]], representative[inputs])
    cluster_size = size[inputs].astype(np.int64)
    weight = cluster_size**-config.soft_weight_exponent if config.mode == "soft" else np.ones(len(inputs))
    decisions = pa.table(
        [
            docs.column("row").take(pa.array(inputs)),
            pa.array(representative[inputs], pa.string()),
            pa.array(cluster_size),
            pa.array(weight.astype(np.float64)),
            pa.array(~survivor),
            pa.array(reason, pa.string()),
            pa.array(np.where(survivor, None, duplicate_of).astype(object), pa.string()),
        ],
        schema=DECISIONS,
    )
    part = docs.column("part").to_numpy()[inputs].astype(np.int64)
    run.scatter("decisions", decisions, part, bucket.producer)
    return {"clusters_with_duplicates": duplicates_here}


def apply_step(part: Part) -> PartitionOutput:
    run = part.run
    table = read_part(run.repo, run.input_commit, part.path)
    decisions = run.read(run.at("decisions", part.index), DECISIONS).sort_by("row")
    if decisions.column("row").to_pylist() != list(range(table.num_rows)):
        raise AssertionError(f"dedup: the decisions for {part.path} do not cover each of its rows once")
    plan = DedupPlan(
        dup_cluster=decisions.column("dup_cluster").to_numpy(zero_copy_only=False).astype(object),
        cluster_size=decisions.column("cluster_size").to_numpy(),
        weight=decisions.column("weight").to_numpy(),
        removed=decisions.column("removed").to_numpy(zero_copy_only=False),
        reason=decisions.column("reason").to_numpy(zero_copy_only=False).astype(object),
        duplicate_of=decisions.column("duplicate_of").to_numpy(zero_copy_only=False).astype(object),
        index_entries=pa.table({}),
        clusters=pa.table({}),
        similar_pairs=pa.table({}),
    )
    kept, quarantined = apply_plan(table, plan, 0)
    output = write_partition(
        run.repo, run.branch, STAGE, layout.DEDUP, part.source, part.path.rsplit("/", 1)[1], kept, quarantined
    )
    output.facts = {"weight_total": float(np.sum(plan.weight[~plan.removed]))}
    return output
