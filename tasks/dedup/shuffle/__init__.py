"""Dedup at scale: the plan of :func:`tasks.dedup.plan.plan_dedup` as a shuffle over buckets.

No process holds the corpus: each step is one partition map (:mod:`tasks.partition_map`)
over input parts or over ``B`` hash buckets (``DedupConfig.buckets``), and steps hand data to
each other as Parquet files that the workers write under a scratch folder of the run branch
(``_scratch/dedup/``, removed before the stage commits). Only small counts come back.

1. ``keys`` (per input part): content keys; the rows go to their **id** bucket, the contents
   to their **content** bucket.
2. ``needs`` (per content bucket): the contents no published run holds a signature for, each
   assigned to the first part that has it.
3. ``signatures`` (per input part): shingles and MinHash of the contents assigned to the part
   (each new text hashed once in the whole run), to their content bucket.
4. ``resolve`` (per id bucket): input rows against the published documents of the bucket
   (latest entry per id): which rows are already published, which published documents are not
   in the input; every document considered goes to its content bucket; new documents are
   written to the index (``documents/``).
5. ``contents`` (per content bucket): each live content's signature (new or published), its
   band keys (stored ones reused when the banding is the same), band records to their
   **band-key** bucket; new contents written to the index (``contents/``).
6. ``pairs`` (per band-key bucket): the rows of one LSH bucket sorted by content key, each
   paired with the next ``bucket_window`` (the rule of :func:`tasks.dedup.minhash.bucket_pairs`),
   pairs to the content bucket of their first content.
7. ``attach`` then ``verify`` (per content bucket): each pair gets the signature of its first
   content, then of its second, and is kept when the estimated similarity reaches the threshold.
8. ``components-*`` (per content bucket, in rounds): connected components of the verified
   edges by hooking and pointer jumping (:mod:`tasks.dedup.shuffle.components`); each linked
   content's label is its component's smallest content key, as union-find's.
9. ``partials`` (per content bucket: each cluster's best document here, to the cluster's
   label bucket), ``representatives`` (per label bucket: the survivor and size of each
   cluster, back to the buckets that hold its contents), ``decide`` (per content bucket):
   the survivor of every cluster by the rule of :mod:`tasks.dedup.plan` (published first,
   then quality, then the smallest id), each input row's decision to its input part.
10. ``apply`` (per input part): the part's rows and decisions into ``dedup/`` and
    ``quarantine/dedup/`` (same part name).

Equal band keys, contents, documents and ids always meet in one bucket, and every order that
decides a result (content keys inside an LSH bucket, the preference of a cluster) is a sort
on values, so the decisions equal the in-memory plan's whatever the bucket count, the
partitioning or the runner (``tests/tasks/test_dedup_shuffle.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tasks.dedup.shuffle.candidates import (
    attach_step,
    contents_step,
    keys_step,
    needs_step,
    pairs_step,
    resolve_step,
    signatures_step,
    verify_step,
)
from tasks.dedup.shuffle.clusters import apply_step, decide_step, partials_step, representatives_step
from tasks.dedup.shuffle.components import connected_components
from tasks.dedup.shuffle.scratch import Bucket, Part, ShuffleRun
from tasks.partition_map import partitions

__all__ = ["Part", "ShuffleRun", "ShuffleStats", "apply_step", "plan_in_buckets"]


# ---- the whole plan ------------------------------------------------------------------------


@dataclass
class ShuffleStats:
    numbers: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def step(self, name: str, work: Callable[[Any], dict[str, int]], items: Iterable[Any]) -> dict[str, int]:
        """One partition map; its counts summed (returned, and added to the run's); a step run
        several times (the components' rounds) adds up its seconds."""
        started = time.perf_counter()
        summed: dict[str, int] = {}
        for counts in partitions().map(f"dedup-{name}", work, list(items)):
            for key, value in counts.items():
                summed[key] = summed.get(key, 0) + value
        for key, value in summed.items():
            self.numbers[key] = self.numbers.get(key, 0) + value
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 3)
        return summed


def plan_in_buckets(run: ShuffleRun, parts: list[Part]) -> ShuffleStats:
    """Steps 1-9: every input row's decision written to the scratch folder; returns the counts."""
    buckets = [Bucket(run, b) for b in range(run.buckets)]
    stats = ShuffleStats()
    stats.step("keys", keys_step, parts)
    stats.step("needs", needs_step, buckets)
    stats.step("signatures", signatures_step, parts)
    stats.step("resolve", resolve_step, buckets)
    stats.step("contents", contents_step, buckets)
    stats.step("pairs", pairs_step, buckets)
    stats.step("attach", attach_step, buckets)
    stats.step("verify", verify_step, buckets)
    stats.numbers |= connected_components(run, stats.step)
    stats.step("partials", partials_step, buckets)
    stats.step("representatives", representatives_step, buckets)
    stats.step("decide", decide_step, buckets)
    stats.numbers["clusters_with_duplicates"] = stats.numbers.get(
        "clusters_with_duplicates", 0
    ) + stats.numbers.pop("linked_clusters", 0)
    return stats
