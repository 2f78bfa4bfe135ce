"""The mix stage: resolve a :class:`~formats.mix.MixSpec` against ``shards/manifest.json`` at
the input commit into ``mix.json``.

The mixture rules live in :mod:`formats.mix`, shared with the training loader; this module
only reads the manifest, writes the plan and reports it. A spec that cannot be resolved fails
the stage with :class:`~formats.mix.MixSpecError` (one sentence) before anything is written.
"""

from __future__ import annotations

from typing import Any

from formats import layout
from formats.mix import MixPlan, MixSpec, resolve_mix
from formats.shards import Manifest
from tasks.stage import StageReport, StageWriter
from versioning import DataRepo, NotFound

STAGE = "mix"


def run_mix(repo: DataRepo, branch: str, input_commit: str, config: MixSpec) -> StageReport:
    try:
        manifest = Manifest.from_json(repo.get(input_commit, layout.MANIFEST))
    except NotFound:
        raise ValueError(
            f"no {layout.MANIFEST} at commit {input_commit}; run the shard stage first"
        ) from None
    plan = resolve_mix(config, manifest.sources, manifest.seq_len)  # the pure core
    stage = StageWriter(repo, branch, STAGE)
    repo.put(branch, layout.MIX, plan.to_json().encode())

    report = stage.finish()
    report.tokens = plan.total_tokens
    report.per_source = source_rows(plan)
    report.extra = {
        "mix_sha256": plan.sha256(),
        "manifest_sha256": manifest.sha256(),
        "seq_len": plan.seq_len,
        "total_samples": plan.total_samples,
        "total_tokens": plan.total_tokens,
        "phases": [{"start_sample": p.start, "stop_sample": p.stop} for p in plan.phases],
        "seed": plan.seed,
    }
    report.note = (
        f"{plan.total_samples} samples over {len(plan.source_names)} sources, mix {plan.sha256()[:12]}"
    )
    report.commit_metadata |= {"mix_sha256": plan.sha256(), "manifest_sha256": manifest.sha256()}
    return report


def source_rows(plan: MixPlan) -> dict[str, dict[str, Any]]:
    """Per source: what the manifest holds, its target weight in each phase, and its resolved budget."""
    rows = {}
    for i, name in enumerate(plan.source_names):
        rows[name] = {
            "sequences": plan.source_sequences[i],
            "tokens": plan.source_tokens[i],
            "weights": [round(p.weights[i], 6) for p in plan.phases],
            "samples": plan.samples[i],
            "token_budget": plan.token_budgets[i],
            "epochs": round(plan.epochs[i], 4),
            "max_epochs": plan.max_epochs[i],
        }
    return rows
