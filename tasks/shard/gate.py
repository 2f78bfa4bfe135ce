"""The Great Expectations gate of the shard stage: ``expectations/shard_manifest.json`` over the manifest.

The manifest becomes a table of one row per shard, with the per-source and total sums
the suite compares (declared in the manifest vs summed from its shards). Great
Expectations is imported here, lazily: it costs seconds.
"""

from __future__ import annotations

from typing import Any

from expectations import load_suite
from formats.shards import HEADER_SIZE, Manifest

SUITE = "shard_manifest"
SHARD_COLUMNS = [
    "name",
    "source",
    "sha256",
    "sequences",
    "tokens",
    "bytes",
    "sequences_times_row_length",
    "header_plus_token_bytes",
    "sequences_above_source_minimum",
    "source_declared_sequences",
    "source_summed_sequences",
    "source_declared_tokens",
    "source_summed_tokens",
]


class ShardGateError(ValueError):
    """The manifest failed its expectation suite; the stage does not commit."""


def manifest_table(manifest: Manifest) -> list[dict[str, Any]]:
    """One row per shard with the derived columns the suite checks."""
    row_len = manifest.seq_len + 1
    itemsize = manifest.numpy_dtype.itemsize
    summed: dict[str, dict[str, int]] = {}
    minimum: dict[str, int] = {}
    for e in manifest.shards:
        sums = summed.setdefault(e.source, {"sequences": 0, "tokens": 0})
        sums["sequences"] += e.sequences
        sums["tokens"] += e.tokens
        minimum[e.source] = min(minimum.get(e.source, e.sequences), e.sequences)
    rows = []
    for e in manifest.shards:
        declared = manifest.sources.get(e.source, {"sequences": -1, "tokens": -1})
        rows.append(
            {
                "name": e.name,
                "source": e.source,
                "sha256": e.sha256,
                "sequences": e.sequences,
                "tokens": e.tokens,
                "bytes": e.bytes,
                "sequences_times_row_length": e.sequences * row_len,
                "header_plus_token_bytes": HEADER_SIZE + e.tokens * itemsize,
                "sequences_above_source_minimum": e.sequences - minimum[e.source],
                "source_declared_sequences": declared["sequences"],
                "source_summed_sequences": summed[e.source]["sequences"],
                "source_declared_tokens": declared["tokens"],
                "source_summed_tokens": summed[e.source]["tokens"],
            }
        )
    return rows


def validate_manifest(manifest: Manifest) -> dict[str, Any]:
    """Run the suite; returns ``{suite, success, failed: [{expectation, why, observed}], evaluated}``."""
    import great_expectations as gx
    import pandas as pd
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    suite_json = load_suite(SUITE)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas("shard_manifest")
        .add_dataframe_asset("shards")
        .add_batch_definition_whole_dataframe("all_shards")
        .get_batch(
            batch_parameters={"dataframe": pd.DataFrame(manifest_table(manifest), columns=SHARD_COLUMNS)}
        )
    )
    suite = gx.ExpectationSuite(
        name=suite_json["name"],
        expectations=[ExpectationConfiguration(**e).to_domain_obj() for e in suite_json["expectations"]],
    )
    result = batch.validate(
        suite,
        expectation_parameters={
            "declared_total_sequences": manifest.totals["sequences"],
            "declared_total_tokens": manifest.totals["tokens"],
            "declared_source_count": len(manifest.sources),
        },
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["name"]},
    )
    failed = []
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        details = r.result or {}
        observed = details.get("observed_value")
        if "unexpected_index_list" in details:
            observed = sorted({str(row.get("name")) for row in details["unexpected_index_list"]})
        elif r.exception_info and r.exception_info.get("raised_exception"):
            observed = r.exception_info.get("exception_message")
        bounds = {config.kwargs.get("min_value"), config.kwargs.get("max_value")} - {None}
        failed.append(
            {
                "expectation": config.type,
                "expected": str(bounds.pop()) if len(bounds) == 1 else None,
                "column": config.kwargs.get("column") or config.kwargs.get("column_A"),
                "why": (config.meta or {}).get("why", ""),
                "observed": observed if isinstance(observed, list | str | None) else str(observed),
            }
        )
    return {
        "suite": SUITE,
        "success": bool(result.success),
        "evaluated": len(result.results),
        "failed": failed,
    }


def gate_manifest(manifest: Manifest) -> dict[str, Any]:
    """Validate; raise ShardGateError naming each failed expectation, else return the summary."""
    summary = validate_manifest(manifest)
    if not summary["success"]:
        reasons = "; ".join(
            f"{f['why']} (observed {f['observed']}"
            + (f", expected {f['expected']})" if f["expected"] else ")")
            for f in summary["failed"]
        )
        raise ShardGateError(f"shards/manifest.json failed the {SUITE} suite: {reasons}")
    return summary
