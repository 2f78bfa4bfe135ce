"""Dedup stage: exact duplicates by content hash, near duplicates by MinHash LSH, soft weights,
and an incremental index of published documents. See docs/dedup_mix.md."""

from tasks.dedup.config import DedupConfig
from tasks.dedup.plan import EXACT, NEAR, DedupPlan, PublishedIndex, apply_plan, deduplicate, plan_dedup
from tasks.dedup.stage import run_dedup

__all__ = [
    "EXACT",
    "NEAR",
    "DedupConfig",
    "DedupPlan",
    "PublishedIndex",
    "apply_plan",
    "deduplicate",
    "plan_dedup",
    "run_dedup",
]
