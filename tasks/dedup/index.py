"""The incremental dedup index in the dataset repository: ``index/minhash/``.

Layout::

    index/minhash/<signature key>/params.json                 what the signatures depend on
    index/minhash/<signature key>/<run>/part-NNNNN.parquet     one dedup run's new documents
    index/minhash/<signature key>/<run>/run.json               its banding and input commit

Each dedup run adds, in its own ``<run>`` folder, the documents it saw that the index did not
hold yet (new ids, or ids whose text changed): id, source, content key, quality, MinHash
signature and LSH band keys. The folder name ``vNNNNN-<input commit>`` numbers runs in the
order they were published; when an id appears in several runs the latest entry wins. Runs
are append-only and named per input commit, so two curate branches never write the same
path and their merges into ``main`` do not conflict.

"Published" means present at the stage's input commit, which descends from ``main``: a run
reads the index there and never sees entries of an unpublished (failed) curate run. A
signature key names the signature parameters (:meth:`DedupConfig.signature_parameters`);
a config with other parameters reads and writes another folder, since its signatures would
not compare.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from formats import layout
from tasks.dedup.config import DedupConfig
from tasks.dedup.plan import PublishedIndex, keys_from_arrow
from tasks.parts import PartWriter, put_json, read_parts
from versioning import DataRepo


def index_folder(config: DedupConfig) -> str:
    return f"{layout.MINHASH_INDEX}/{config.signature_key()}"


def run_folders(repo: DataRepo, ref: str, config: DedupConfig) -> list[str]:
    """The run folders of this config's index at ``ref``, oldest first."""
    base = index_folder(config) + "/"
    names = {o.path[len(base) :].split("/", 1)[0] for o in repo.list(ref, base) if "/" in o.path[len(base) :]}
    return sorted(f"{base}{name}" for name in names)


def next_run_folder(repo: DataRepo, input_commit: str, config: DedupConfig) -> str:
    """Where this run writes: numbered after the runs published at its input commit."""
    return f"{index_folder(config)}/v{len(run_folders(repo, input_commit, config)):05d}-{input_commit[:16]}"


def load_published(repo: DataRepo, ref: str, config: DedupConfig) -> PublishedIndex:
    """Every published document's index entry at ``ref`` (latest per id)."""
    tables, bandings = [], set()
    for folder in run_folders(repo, ref, config):
        run = json.loads(repo.get(ref, f"{folder}/run.json"))
        bandings.add((int(run["bands"]), int(run["rows"])))
        tables += list(read_parts(repo, ref, folder))
    if not tables:
        return PublishedIndex.empty(config.num_perm)
    same_banding = len(bandings) == 1
    if not same_banding:  # band keys of different widths cannot be stacked; they are recomputed
        tables = [t.drop_columns(["band_keys"]) for t in tables]
    table = pa.concat_tables(tables)
    latest = (
        table.append_column("_row", pa.array(np.arange(table.num_rows)))
        .group_by("id", use_threads=False)
        .aggregate([("_row", "max")])
    )
    table = table.take(np.sort(latest.column("_row_max").to_numpy()))
    signature = table.column("signature").combine_chunks().flatten().to_numpy()
    band_keys, banding = None, None
    if same_banding:
        banding = bandings.pop()
        band_keys = (
            table.column("band_keys").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
        )
    return PublishedIndex(
        ids=table.column("id").to_numpy(zero_copy_only=False).astype(object),
        sources=table.column("source").to_numpy(zero_copy_only=False).astype(object),
        content_keys=keys_from_arrow(table.column("content_key")),
        quality=table.column("quality").to_numpy(zero_copy_only=False).astype(np.float64),
        signatures=signature.reshape(table.num_rows, config.num_perm).astype(np.uint32),
        band_keys=band_keys,
        banding=banding,
    )


def write_index_run(
    repo: DataRepo, branch: str, folder: str, entries: pa.Table, config: DedupConfig, input_commit: str
) -> list[str]:
    """Stage this run's entries (and the folder's params.json); returns the part paths."""
    bands, rows = config.banding
    put_json(repo, branch, f"{index_folder(config)}/params.json", config.signature_parameters())
    put_json(
        repo,
        branch,
        f"{folder}/run.json",
        {"bands": bands, "rows": rows, "input_commit": input_commit, "documents": entries.num_rows},
    )
    with PartWriter(repo, branch, folder, rows_per_part=200_000) as writer:
        writer.write(entries)
    return writer.paths
