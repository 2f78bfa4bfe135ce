"""The safety stage, between dedup and shard: URL blocklists, benchmark decontamination, PII
and secrets (docs/ingest_validate.md, "Safety"). The pure core is
:func:`tasks.safety.screen.apply_safety`; ``run_safety`` reads, writes and commits."""

from tasks.safety.config import SafetyConfig
from tasks.safety.screen import SafetyChecks, apply_safety
from tasks.safety.stage import check_files, run_safety

__all__ = ["SafetyChecks", "SafetyConfig", "apply_safety", "check_files", "run_safety"]
