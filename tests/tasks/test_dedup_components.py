"""The distributed connected components of the dedup shuffle (tasks/dedup/shuffle/components.py)
against single-process union-find (tasks/dedup/minhash.py) on generated graphs: the same label
(the component's smallest content key) for every linked content, with no task holding more
than its bucket's share of the graph."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.dedup.config import DedupConfig
from tasks.dedup.index import content_buckets
from tasks.dedup.minhash import connected_components as union_find
from tasks.dedup.plan import keys_from_arrow, keys_to_arrow
from tasks.dedup.shuffle import ShuffleRun, ShuffleStats
from tasks.dedup.shuffle.components import connected_components
from tasks.dedup.shuffle.scratch import EDGES, LABELS
from versioning.local import LocalRepo

SCRATCH = "_scratch/dedup"


def random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = np.frombuffer(rng.bytes(16 * n), "S16").copy()
    assert len(np.unique(keys)) == n
    return keys


def chain(n: int, order: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = random_keys(rng, n)
    if order == "ascending":
        keys = np.sort(keys)
    elif order == "descending":
        keys = np.sort(keys)[::-1]
    return keys, np.arange(n - 1), np.arange(1, n)


def star(n: int, center: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.sort(random_keys(rng, n))
    hub = {"smallest": 0, "largest": n - 1, "middle": n // 2}[center]
    leaves = np.delete(np.arange(n), hub)
    return keys, np.full(n - 1, hub), leaves


def giant(n: int, extra: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random tree over every node (one component) plus random extra edges (cycles)."""
    keys = random_keys(rng, n)
    child = np.arange(1, n)
    parent = rng.integers(0, child)  # each node under an earlier one
    a, b = rng.integers(0, n, extra), rng.integers(0, n, extra)
    return keys, np.r_[parent, a], np.r_[child, b]


def many_small(clusters: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs and triangles and paths of 4: thousands of components."""
    sizes = rng.integers(2, 5, clusters)
    keys = random_keys(rng, int(sizes.sum()))
    a, b, start = [], [], 0
    for size in sizes:
        nodes = np.arange(start, start + size)
        a += list(nodes[:-1])
        b += list(nodes[1:])
        if size == 3:
            a.append(nodes[0])
            b.append(nodes[2])
        start += size
    return keys, np.array(a), np.array(b)


GRAPHS = {
    "chain-random-order": lambda rng: chain(3000, "random", rng),
    "chain-ascending": lambda rng: chain(3000, "ascending", rng),
    "chain-descending": lambda rng: chain(3000, "descending", rng),
    "star-hub-smallest": lambda rng: star(4000, "smallest", rng),
    "star-hub-largest": lambda rng: star(4000, "largest", rng),
    "star-hub-middle": lambda rng: star(4000, "middle", rng),
    "one-giant-cluster": lambda rng: giant(5000, 2000, rng),
    "many-small-clusters": lambda rng: many_small(2000, rng),
    "mixed": lambda rng: tuple(
        np.r_[x, y]
        for x, y in zip(
            chain(500, "random", rng),
            (lambda k, a, b: (k, a + 500, b + 500))(*many_small(300, rng)),
            strict=True,
        )
    ),
}


def put_edges(run: ShuffleRun, keys: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """The verified edges as the verify step leaves them: by the bucket of their second content,
    in random order and orientation, with some edges twice."""
    rng = np.random.default_rng(1)
    flip = rng.random(len(a)) < 0.5
    first, second = np.where(flip, b, a), np.where(flip, a, b)
    twice = rng.random(len(a)) < 0.1
    first, second = np.r_[first, second[twice]], np.r_[second, first[twice]]
    order = rng.permutation(len(first))
    edges = pa.table([keys_to_arrow(keys[first[order]]), keys_to_arrow(keys[second[order]])], schema=EDGES)
    bucket = content_buckets(keys[second[order]], run.buckets)
    for b_ in range(run.buckets):
        run.put(run.at("edges", b_, "edges"), edges.filter(pa.array(bucket == b_)))


def union_find_labels(keys: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict[bytes, bytes]:
    nodes = np.unique(keys[np.r_[a, b]])
    parent = union_find(len(nodes), np.searchsorted(nodes, keys[a]), np.searchsorted(nodes, keys[b]))
    return dict(zip(nodes.tolist(), nodes[parent].tolist(), strict=True))


def distributed(
    tmp_path, keys, a, b, buckets: int
) -> tuple[dict[bytes, bytes], dict[str, int], LocalRepo, ShuffleRun]:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    run = ShuffleRun(repo, "main", "", DedupConfig(buckets=buckets), SCRATCH, "", ())
    put_edges(run, keys, a, b)
    counts = connected_components(run, ShuffleStats().step)
    labels: dict[bytes, bytes] = {}
    for bucket in range(buckets):
        table = run.read(run.at("labels", bucket), LABELS)
        nodes = keys_from_arrow(table.column("content_key"))
        assert (content_buckets(nodes, buckets) == bucket).all() and (np.sort(nodes) == nodes).all()
        labels.update(zip(nodes.tolist(), keys_from_arrow(table.column("label")).tolist(), strict=True))
    return labels, counts, repo, run


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_the_components_give_union_finds_labels(tmp_path, graph):
    keys, a, b = GRAPHS[graph](np.random.default_rng(sorted(GRAPHS).index(graph)))
    expected = union_find_labels(keys, a, b)
    labels, counts, repo, _ = distributed(tmp_path, keys, a, b, buckets=7)
    assert labels == expected
    assert counts["linked_contents"] == len(expected)
    # rounds and jumps grow with the logarithm of the longest path (a random-order chain of
    # 3,000 takes 8 rounds: its trees fall about threefold per round), each round at most
    # log2(n) + 1 jumps and one that finds nothing changed
    rounds, jumps = counts["components_rounds"], counts["components_jumps"]
    assert 1 <= rounds <= np.log2(len(expected)) + 1 and jumps <= rounds * (np.log2(len(expected)) + 2)
    repo.close()


def test_one_bucket_and_no_edges(tmp_path):
    keys, a, b = GRAPHS["mixed"](np.random.default_rng(5))
    labels, _, repo, _ = distributed(tmp_path / "one", keys, a, b, buckets=1)
    assert labels == union_find_labels(keys, a, b)
    repo.close()
    labels, counts, repo, _ = distributed(tmp_path / "none", keys[:0], a[:0], b[:0], buckets=4)
    assert labels == {} and counts["linked_contents"] == 0
    repo.close()


def test_no_task_reads_more_than_its_buckets_share_of_a_star(tmp_path):
    """A 4,000-leaf star whose hub is its largest key: at the end every node points at the
    smallest leaf, and its bucket is asked for it once per bucket, not once per leaf. No step
    reads more rows in a bucket than the bucket's edges or its share of the nodes."""
    buckets = 8
    keys, a, b = star(4000, "largest", np.random.default_rng(3))
    labels, _, repo, run = distributed(tmp_path, keys, a, b, buckets)
    assert labels == union_find_labels(keys, a, b)
    rows: dict[tuple[str, int], int] = defaultdict(int)
    for step in {o.path.split("/")[2] for o in repo.list("main", SCRATCH + "/")}:
        for bucket in range(buckets):
            for source, _ in run.sources(run.at(step, bucket)):
                data = pa.BufferReader(run.source_bytes(source))
                rows[step, bucket] += pq.read_metadata(data).num_rows
    edges = max(n for (step, _), n in rows.items() if step == "edges")
    share = 2 * len(keys) / buckets  # a bucket's nodes, with room for the hash's unevenness
    assert max(n for (step, _), n in rows.items() if step.startswith("cc-")) <= max(edges, share)
    root_bucket = int(content_buckets(keys[:1], buckets)[0])
    asked_of_root = [n for (step, b_), n in rows.items() if step.endswith("-requests") and b_ == root_bucket]
    assert asked_of_root and max(asked_of_root) <= buckets + share / 4
    repo.close()
