"""Step 8 of the dedup shuffle: connected components of the verified edges, as partition tasks.

Union-find in one task holds every verified edge (~73 GB at 100 TB). Here each content bucket
holds its own nodes' parent pointers and its own edges, and the components are found by
rounds of **hooking and pointer jumping** (the scheme of Shiloach and Vishkin, with the
hook of the vectorised union-find in :func:`tasks.dedup.minhash.connected_components`):

1. ``start`` (per edge bucket): every node starts as its own parent; each edge proposes to
   hook its larger endpoint under its smaller one.
2. ``apply`` (per bucket): a root takes the smallest root proposed to it as its parent.
   Parents only ever get smaller, so no cycle can form.
3. ``answer`` / ``jump`` (per bucket, repeated until no parent changes): each node asks its
   parent's bucket for the parent's parent and takes it; afterwards every node points at
   its tree's root.
4. ``send`` / ``propose`` (per bucket): each edge between two trees proposes to hook the
   larger root under the smaller; if no edge does, the trees are the components, and each
   root is its component's smallest content key: the label union-find gives.

A task holds its bucket's parents and edges plus what other buckets send it. Requests are
deduplicated per sending bucket, so the root of a giant cluster receives at most one request
per bucket, not one per member: memory is bounded by the bucket, whatever the largest
cluster. Content keys are hashes, so the hooks are random-order hooks and the rounds grow
with the logarithm of the longest path (``tests/tasks/test_dedup_components.py`` counts them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.dedup.index import content_buckets
from tasks.dedup.plan import keys_from_arrow, keys_to_arrow
from tasks.dedup.shuffle.scratch import EDGES, KEY, LABELS, Bucket, ShuffleRun

Step = Callable[[str, Callable[[object], dict[str, int]], list[object]], dict[str, int]]
PARENTS = LABELS  # (content_key, label): a node and its parent; the final parents are the labels
NODES = pa.schema([("content_key", KEY)])
PROPOSALS = pa.schema([("root", KEY), ("parent", KEY)])
REQUESTS = pa.schema([("content_key", KEY), ("bucket", pa.int32())])
MEETS = pa.schema([("content_key", KEY), ("root", KEY)])


@dataclass(frozen=True)
class At:
    """One bucket's task in round ``round`` and jump ``jump`` of the components."""

    bucket: Bucket
    round: int
    jump: int = 0
    previous_jump: int = 0  # the last jump of the round before (where ``apply`` finds its parents)

    @property
    def run(self) -> ShuffleRun:
        return self.bucket.run

    @property
    def b(self) -> int:
        return self.bucket.bucket

    def folder(self, what: str, round_: int | None = None, jump: int | None = None) -> str:
        """``<scratch>/cc-<round>-<jump>-<what>/b<bucket>``: what this bucket reads there."""
        return self.run.at(self.step_name(what, round_, jump), self.b)

    def scatter(
        self, what: str, table: pa.Table, keys: np.ndarray, round_: int | None = None, jump: int | None = None
    ) -> None:
        self.run.scatter(
            self.step_name(what, round_, jump),
            table,
            content_buckets(keys, self.run.buckets),
            self.bucket.producer,
        )

    def put_parents(self, parents: pa.Table, jump: int) -> None:
        self.run.put(self.run.at(self.step_name("parents", None, jump), self.b, "parents"), parents)

    def step_name(self, what: str, round_: int | None = None, jump: int | None = None) -> str:
        return f"cc-{self.round if round_ is None else round_}-{self.jump if jump is None else jump}-{what}"


def connected_components(run: ShuffleRun, step: Step) -> dict[str, int]:
    """Every linked content's label under ``labels/`` (as union-find's); ``step(name, work,
    items)`` runs one partition map and returns its summed counts. Returns the rounds, the
    jumps and the number of linked contents."""
    buckets = [Bucket(run, b) for b in range(run.buckets)]
    proposals = step("components-start", start_step, [At(b, 0) for b in buckets])["cc_proposals"]
    rounds = jumps = jump = 0
    while True:
        step("components-apply", apply_step, [At(b, rounds, 0, jump) for b in buckets])
        jump = 0
        while True:  # until every node points at its tree's root
            step("components-answer", answer_step, [At(b, rounds, jump) for b in buckets])
            changed = step("components-jump", jump_step, [At(b, rounds, jump) for b in buckets])
            jump += 1
            if not changed.get("cc_changed"):
                break
        jumps += jump
        final = [At(b, rounds, jump) for b in buckets]
        rounds += 1
        if proposals:
            step("components-send", send_step, final)
            proposals = step("components-propose", propose_step, final).get("cc_proposals", 0)
        if not proposals:  # no edge joins two trees: the trees are the components
            break
    counts = step("components-labels", labels_step, final)
    return {
        "components_rounds": rounds,
        "components_jumps": jumps,
        "linked_contents": counts.get("linked_contents", 0),
    }


# ---- the steps -----------------------------------------------------------------------------


def start_step(at: At) -> dict[str, int]:
    """The bucket's edges (those whose second content is here): their endpoints to the buckets
    that keep their parents, and a hook of each larger endpoint under the smaller."""
    edges = at.run.read(at.run.at("edges", at.b), EDGES)
    a, b = keys_from_arrow(edges.column("a")), keys_from_arrow(edges.column("b"))
    nodes = np.unique(np.concatenate([a, b]))
    at.scatter("nodes", pa.table([keys_to_arrow(nodes)], schema=NODES), nodes)
    return {"cc_proposals": _propose(at, np.where(a < b, b, a), np.where(a < b, a, b), round_=0)}


def apply_step(at: At) -> dict[str, int]:
    """Round ``r``'s parents: last round's (or every node its own), each root hooked under the
    smallest root proposed to it; then the first requests for the parents' parents."""
    if at.round == 0:
        nodes = np.unique(keys_from_arrow(at.run.read(at.folder("nodes", 0, 0), NODES).column("content_key")))
        node, parent = nodes, nodes.copy()
    else:
        node, parent = _parents(at.run, at.folder("parents", at.round - 1, at.previous_jump))
    proposals = at.run.read(at.folder("proposals", at.round, 0), PROPOSALS)
    root, offered = keys_from_arrow(proposals.column("root")), keys_from_arrow(proposals.column("parent"))
    hooked = 0
    if len(root):
        order = np.lexsort((offered, root))
        root, offered = root[order], offered[order]
        first = np.r_[True, root[1:] != root[:-1]]  # the smallest offer to each root
        root, offered = root[first], offered[first]
        where = np.searchsorted(node, root)
        if not (np.all(where < len(node)) and np.all(node[np.minimum(where, len(node) - 1)] == root)):
            raise AssertionError("components: a hook was proposed to a content this bucket does not hold")
        lower = offered < parent[where]
        parent[where[lower]] = offered[lower]
        hooked = int(lower.sum())
    at.put_parents(_table(node, parent), 0)
    _request(at, node, parent, 0)
    return {"cc_hooked": hooked}


def answer_step(at: At) -> dict[str, int]:
    """The parents other buckets asked about, with their own parents, back to each asker."""
    requests = at.run.read(at.folder("requests"), REQUESTS)
    if requests.num_rows == 0:
        return {}
    node, parent = _parents(at.run, at.folder("parents"))
    asked = keys_from_arrow(requests.column("content_key"))
    where = np.searchsorted(node, asked)
    if not (np.all(where < len(node)) and np.all(node[np.minimum(where, len(node) - 1)] == asked)):
        raise AssertionError("components: a parent was asked of a bucket that does not hold it")
    answers = _table(asked, parent[where])
    asker = requests.column("bucket").to_numpy().astype(np.int64)
    at.run.scatter(at.step_name("answers"), answers, asker, at.bucket.producer)
    return {}


def jump_step(at: At) -> dict[str, int]:
    """Each node's parent replaced by its parent's parent; the next requests."""
    node, parent = _parents(at.run, at.folder("parents"))
    answers = at.run.read(at.folder("answers"), PARENTS)
    changed = 0
    if answers.num_rows:
        asked = keys_from_arrow(answers.column("content_key"))
        grand = keys_from_arrow(answers.column("label"))
        order = np.argsort(asked)
        asked, grand = asked[order], grand[order]
        moving = parent != node
        where = np.searchsorted(asked, parent[moving])
        if not np.all(asked[np.minimum(where, len(asked) - 1)] == parent[moving]):
            raise AssertionError("components: a parent's parent did not come back")
        new = grand[where]
        changed = int(np.count_nonzero(new != parent[moving]))
        parent[moving] = new
    at.put_parents(_table(node, parent), at.jump + 1)
    _request(at, node, parent, at.jump + 1)
    return {"cc_changed": changed}


def send_step(at: At) -> dict[str, int]:
    """Each edge of the bucket: its second content's root, to the bucket of its first content."""
    edges = at.run.read(at.run.at("edges", at.b), EDGES)
    if edges.num_rows == 0:
        return {}
    node, parent = _parents(at.run, at.folder("parents"))
    a, b = keys_from_arrow(edges.column("a")), keys_from_arrow(edges.column("b"))
    root_b = parent[np.searchsorted(node, b)]
    meets = np.unique(np.rec.fromarrays([a, root_b]))  # the same pair from several edges once
    at.scatter("meets", pa.table([keys_to_arrow(meets.f0), keys_to_arrow(meets.f1)], schema=MEETS), meets.f0)
    return {}


def propose_step(at: At) -> dict[str, int]:
    """Where an edge joins two trees: a hook of the larger root under the smaller, for next round."""
    meets = at.run.read(at.folder("meets"), MEETS)
    if meets.num_rows == 0:
        return {"cc_proposals": 0}
    node, parent = _parents(at.run, at.folder("parents"))
    root_a = parent[np.searchsorted(node, keys_from_arrow(meets.column("content_key")))]
    root_b = keys_from_arrow(meets.column("root"))
    apart = root_a != root_b
    high = np.where(root_a < root_b, root_b, root_a)[apart]
    low = np.where(root_a < root_b, root_a, root_b)[apart]
    return {"cc_proposals": _propose(at, high, low, round_=at.round + 1)}


def labels_step(at: At) -> dict[str, int]:
    """The final parents (each node's component root) as the bucket's labels."""
    node, parent = _parents(at.run, at.folder("parents"))
    at.run.put(at.run.at("labels", at.b, "components"), _table(node, parent))
    return {"linked_contents": len(node)}


# ---- helpers -------------------------------------------------------------------------------


def _propose(at: At, high: np.ndarray, low: np.ndarray, round_: int) -> int:
    """Hooks of roots ``high`` under ``low``, only the smallest per root, to the roots' buckets."""
    if len(high) == 0:
        return 0
    order = np.lexsort((low, high))
    high, low = high[order], low[order]
    first = np.r_[True, high[1:] != high[:-1]]
    high, low = high[first], low[first]
    at.scatter(
        "proposals", pa.table([keys_to_arrow(high), keys_to_arrow(low)], schema=PROPOSALS), high, round_, 0
    )
    return len(high)


def _request(at: At, node: np.ndarray, parent: np.ndarray, jump: int) -> None:
    """Ask the buckets of this bucket's distinct parents (other than roots) for their parents."""
    asked = np.unique(parent[parent != node])
    requests = pa.table(
        [keys_to_arrow(asked), pa.array(np.full(len(asked), at.b, np.int32))], schema=REQUESTS
    )
    at.scatter("requests", requests, asked, None, jump)


def _parents(run: ShuffleRun, folder: str) -> tuple[np.ndarray, np.ndarray]:
    """A bucket's nodes (sorted) and their parents."""
    table = run.read(folder, PARENTS)
    return keys_from_arrow(table.column("content_key")), keys_from_arrow(table.column("label"))


def _table(node: np.ndarray, parent: np.ndarray) -> pa.Table:
    return pa.table([keys_to_arrow(node), keys_to_arrow(parent)], schema=PARENTS)
