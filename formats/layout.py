"""The layout of a dataset repository and the order of the curate stages: their one definition.

Stages, flows, the trainer and the lineage queries name every branch, folder and file of the
repository through this module (DESIGN.md section 3), so moving one is one edit here::

    raw/<source>/part-NNNNN.parquet                  ingested documents
    filtered/<source>/part-NNNNN.parquet             passed the quality stage (+ signal columns)
    dedup/<source>/part-NNNNN.parquet                survivors (+ cluster size, sampling weight)
    safe/<source>/part-NNNNN.parquet                 after the safety stage: not blocked, not contaminated, redacted
    eval_sets/<name>/<file>                          the benchmark files the safety stage decontaminated against
    eval_sets/<name>/spec.json                       ... their fields, n-gram size and counts
    blocklists/<name>.txt                            the URL/domain blocklists the safety stage applied
    quarantine/<stage>/<source>/part-NNNNN.parquet   rejected documents + reason
    index/minhash/...                                LSH keys of every published document
    tokenizer/tokenizer.json
    shards/<source>/shard-NNNNN.bin                  packed token sequences
    shards/manifest.json
    mix.json                                         the mixture plan
    reports/<stage>.json                             counts, timings, Great Expectations results
    reports/data_docs/<stage>/...                    Great Expectations Data Docs of a stage's gate
    _lakefs_actions/tokenlake_publish_guard.yaml     the publish guard lakeFS runs before a merge
    _tokenlake/hooks/publish_gates.lua               ... and its script

and, on branch ``runs``, the training lineage records (``runs/<run>/...``).
"""

from __future__ import annotations

import re

STAGES = ("ingest", "validate", "dedup", "safety", "shard", "mix")
"""The curate stages in pipeline order; each reads what the one before it committed."""

# ---- branches ------------------------------------------------------------------------------

MAIN = "main"  # published dataset versions
LINEAGE_BRANCH = "runs"  # training lineage records
RUN_BRANCH_PREFIX = "curate-"  # + flow run id: one curate run's working branch (lakeFS forbids '/')
PUBLISH_LOCK_BRANCH = "lock-publish"

# ---- tags, and the commits main gets besides stage outputs ----------------------------------

DATASET_TAG_PREFIX = "ds-"  # + YYYYMMDD-N: a published dataset version (flows/wap.py)
ROLLBACK_TAG_PREFIX = "rollback-"  # + YYYYMMDD-N: a rollback of main (flows/restore.py)
PUBLISH_STAGE = "publish"  # a publish merge; its metadata names the stage chain and the tag
ROLLBACK_STAGE = "rollback"  # a rollback's tagged, empty last commit: target, reverted commits, flow run
RESTORE_STAGE = "restore"  # a rollback's commit that writes what reverts could not undo
REVERT_STAGE = "revert"  # a rollback's revert of one commit (``reverted_commit``)

# ---- the publish guard on main, read by lakeFS (flows/publish_guard/) ---------------------

PUBLISH_GUARD_ACTION = "_lakefs_actions/tokenlake_publish_guard.yaml"  # lakeFS reads actions there
PUBLISH_GUARD_SCRIPT = "_tokenlake/hooks/publish_gates.lua"

# ---- documents: <folder>/<source>/part-NNNNN.parquet ---------------------------------------

RAW = "raw"
FILTERED = "filtered"
DEDUP = "dedup"
SAFE = "safe"
QUARANTINE = "quarantine"
DOCUMENTS = {"ingest": RAW, "validate": FILTERED, "dedup": DEDUP, "safety": SAFE}
"""The folder of documents each document stage writes (and the next stage reads)."""


def source_folder(folder: str, source: str) -> str:
    """``<folder>/<source>``: one source's parts of a document folder."""
    return f"{folder}/{source}"


def quarantine_folder(stage: str, source: str | None = None) -> str:
    """``quarantine/<stage>`` or ``quarantine/<stage>/<source>``: documents a stage rejected."""
    return f"{QUARANTINE}/{stage}" if source is None else f"{QUARANTINE}/{stage}/{source}"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


SCRATCH = "_scratch"  # a stage's intermediate files on the run branch, removed before it commits


def scratch_folder(stage: str) -> str:
    return f"{SCRATCH}/{stage}"


# ---- what the safety stage checked against: benchmark sets and blocklists --------------------

EVAL_SETS = "eval_sets"
BLOCKLISTS = "blocklists"


def eval_set_folder(name: str) -> str:
    return f"{EVAL_SETS}/{name}"


def blocklist_path(name: str) -> str:
    return f"{BLOCKLISTS}/{name}.txt"


# ---- dedup index, tokenizer, shards, mix ---------------------------------------------------

MINHASH_INDEX = "index/minhash"
TOKENIZER_FOLDER = "tokenizer"
TOKENIZER = f"{TOKENIZER_FOLDER}/tokenizer.json"
SHARDS = "shards"
MANIFEST = f"{SHARDS}/manifest.json"
MIX = "mix.json"


SHARD_PATH = re.compile(rf"^{SHARDS}/[^/]+/shard-[0-9]{{5}}\.bin$")


def shard_path(source: str, index: int) -> str:
    return f"{SHARDS}/{source}/shard-{index:05d}.bin"


# ---- reports -------------------------------------------------------------------------------

REPORTS = "reports"
DATA_DOCS = f"{REPORTS}/data_docs"
QUALITY_CLASSIFIER = f"{REPORTS}/quality_classifier.npz"


def report_path(stage: str) -> str:
    return f"{REPORTS}/{stage}.json"


def data_docs_folder(stage: str) -> str:
    return f"{DATA_DOCS}/{stage}"


# ---- lineage records, on branch ``runs`` ---------------------------------------------------

RUNS = "runs"
ROLLBACK_RECORDS = f"{RUNS}/_rollbacks"
CHECKPOINT_RECORD = re.compile(rf"^{RUNS}/(?P<run>[^/_][^/]*)/checkpoints/step-(?P<step>\d+)\.json$")
EVENT_RECORD = re.compile(rf"^{RUNS}/(?P<run>[^/_][^/]*)/events/(?P<kind>[a-z-]+)-step-(?P<step>\d+)\.json$")
TAINT_RECORD = re.compile(rf"^{RUNS}/(?P<run>[^/_][^/]*)/taints/step-(?P<step>\d+)\.json$")
ROLLBACK_RECORD = re.compile(rf"^{ROLLBACK_RECORDS}/(?P<tag>[^/]+)\.json$")


def run_records(run: str) -> str:
    """The folder of one training run's records."""
    return f"{RUNS}/{run}"


def checkpoint_record_path(run: str, step: int) -> str:
    return f"{RUNS}/{run}/checkpoints/step-{step:07d}.json"


def event_record_path(run: str, kind: str, step: int) -> str:
    return f"{RUNS}/{run}/events/{kind}-step-{step:07d}.json"


def taint_record_path(run: str, step: int) -> str:
    return f"{RUNS}/{run}/taints/step-{step:07d}.json"


def rollback_record_path(tag: str) -> str:
    return f"{ROLLBACK_RECORDS}/{tag}.json"
