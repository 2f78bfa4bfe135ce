"""Great Expectations gates, one runner for every stage: the JSON suites of ``expectations/`` run
as one GX Checkpoint per stage on what the stage wrote, Data Docs updated by the Checkpoint's
``UpdateDataDocsAction``, failures turned into one readable message.

GX is imported inside :func:`run_gate` (importing it costs seconds). Each :class:`GateCheck` is
one frame and one suite: the frame is written to a Parquet file and becomes one Validation
Definition of the stage's Checkpoint. ``{"$PARAMETER": name}`` values in a suite are filled
from the checks' parameters (the stage's config), so the JSON stays the single description of
what is checked.

A run is filed under a name that says what it checked: ``<stage>-<input commit>-all-<n>`` or,
when the documents were more than the gate reads, ``<stage>-<input commit>-sample-<k>-of-<n>``.
The same words are in the report (``expectations.coverage``) and in the suites' notes on the
Data Docs pages, so nobody mistakes a sample for full coverage.
"""

from __future__ import annotations

import datetime
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from expectations import load_suite
from formats import layout
from tasks.data_docs import make_offline
from tasks.parts import clear_prefix, put_json
from versioning import DataRepo, data_home

if TYPE_CHECKING:
    from tasks.report import StageReport

GATE_TEXT_CHARS = 100  # the frame holds the start of each text; ``text_chars`` its full length
DOCS_SITE = "tokenlake"
ROW = "__row__"  # the frame's index: the check's index columns as JSON, named in failure messages
STATS_SCHEMA = pa.schema(
    [("source", pa.string()), ("rule", pa.string())]
    + [(c, pa.int64()) for c in ("documents_in", "kept", "quarantined", "accounted", "removed")]
    + [(c, pa.float64()) for c in ("removal_rate", "min_removal_rate", "max_removal_rate")]
)
_EXPECTED = {
    "expect_column_values_to_be_unique": "every value unique",
    "expect_column_values_to_not_be_null": "no nulls",
    "expect_column_pair_values_to_be_equal": "{column_A} == {column_B} on every row",
    "expect_column_pair_values_a_to_be_greater_than_b": "{column_A} >= {column_B} on every row",
    "expect_column_values_to_be_between": "values between {min_value} and {max_value}",
    "expect_column_sum_to_be_between": "a sum between {min_value} and {max_value}",
    "expect_column_values_to_be_in_set": "values in {value_set}",
    "expect_column_values_to_match_regex": "values matching {regex}",
    "expect_column_distinct_values_to_contain_set": "every one of {value_set} present",
    "expect_column_unique_value_count_to_be_between": "between {min_value} and {max_value} distinct values",
    "expect_table_columns_to_match_set": "columns {column_set}",
    "expect_column_values_to_be_of_type": "type {type_}",
    "expect_column_value_lengths_to_equal": "length {value}",
    "expect_column_values_to_be_json_parseable": "valid JSON",
    "expect_table_row_count_to_be_between": "between {min_value} and {max_value} rows",
}


class GateSettings(BaseModel):
    """What every stage's Great Expectations gate has: on or off, and how many documents it reads."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_rows: int = Field(
        default=200_000,
        ge=1,
        description="Documents checked: all below this, else the bottom-k sample by id.",
    )


class ExpectationsFailed(RuntimeError):
    """A stage's output broke its expectation suites; the message lists each failed expectation.

    ``stage``, ``summary`` (verdict, suites, coverage), ``failures`` (one line each) and
    ``data_docs`` (the pages' ``index.html`` on this machine) say the same in parts, for a
    caller that words its own report. (The curate flow's own publish gates failing is
    :class:`flows.curate.PublishRefused`.)
    """

    def __init__(self, stage: str, summary: str, failures: list[str], data_docs: str | None):
        where = f"; Data Docs: {data_docs}" if data_docs else ""
        super().__init__(f"{stage} gate {summary}{where}:\n" + "\n".join(f"- {f}" for f in failures))
        self.stage, self.summary, self.failures, self.data_docs = stage, summary, failures, data_docs

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with Prefect's results: rebuilt from the parts
        return (type(self), (self.stage, self.summary, self.failures, self.data_docs))


@dataclass
class GateCheck:
    """One suite run on one frame. ``index_columns`` name the failing rows in messages."""

    suite: str
    frame: pa.Table
    parameters: dict[str, Any] = field(default_factory=dict)
    index_columns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Coverage:
    """How much of a stage's output its gate read: all of it, or a sample."""

    checked: int
    total: int
    unit: str = "documents"

    @classmethod
    def everything(cls, total: int, unit: str) -> Coverage:
        return cls(total, total, unit)

    @property
    def sampled(self) -> bool:
        return self.checked < self.total

    def sentence(self) -> str:
        if self.sampled:
            return (
                f"checked a sample of {self.checked:,} of {self.total:,} {self.unit} "
                "(those with the smallest ids), not all of them"
            )
        return f"checked all {self.total:,} {self.unit}"

    def run_name_part(self) -> str:
        return f"sample-{self.checked}-of-{self.total}" if self.sampled else f"all-{self.total}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampled": self.sampled,
            "documents_checked": self.checked,
            "documents_total": self.total,
            "unit": self.unit,
            "coverage": self.sentence(),
        }


@dataclass
class GateOutcome:
    success: bool
    suites: list[dict[str, Any]]
    failures: list[str]
    run_name: str
    coverage: Coverage
    docs_dir: str | None = None

    @property
    def evaluated(self) -> int:
        return sum(s["evaluated"] for s in self.suites)

    def summary(self) -> str:
        names = ", ".join(s["suite"] for s in self.suites)
        verdict = (
            f"passed {self.evaluated}/{self.evaluated}"
            if self.success
            else f"failed {len(self.failures)}/{self.evaluated}"
        )
        return f"{verdict} expectations ({names}); {self.coverage.sentence()}"

    def metadata(self) -> dict[str, str]:
        """What the stage commit carries about its gate."""
        return {
            "gate": "passed" if self.success else "failed",
            "gate_summary": self.summary(),
            "gate_run": self.run_name,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "summary": self.summary(),
            "run_name": self.run_name,
            "failures": self.failures,
            "suites": self.suites,
            **self.coverage.to_dict(),
        }

    def raise_if_failed(self, stage: str) -> None:
        if not self.success:
            docs = f"{self.docs_dir}/index.html" if self.docs_dir else None
            raise ExpectationsFailed(stage, self.summary(), self.failures, docs)


def _plain(value: Any) -> Any:
    """JSON-safe copy of a GX result value (numpy scalars and the like)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


def _named_row(entry: Any) -> Any:
    """A failing row as GX reports it, with the frame's index turned back into its columns."""
    if isinstance(entry, dict) and ROW in entry:
        return {k: v for k, v in entry.items() if k != ROW} | json.loads(entry[ROW])
    return entry


def _observed(result: dict[str, Any]) -> str:
    if result.get("unexpected_count"):
        rows = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_list") or []
        examples = [_named_row(row) for row in rows[:3]]
        return (
            f"{result['unexpected_count']} of {result.get('element_count')} rows unexpected, "
            f"e.g. {json.dumps(_plain(examples))}"
        )
    if result.get("partial_missing_list"):
        return f"missing {result['partial_missing_list']}"
    if result.get("details", {}).get("mismatched"):
        return f"mismatched columns {result['details']['mismatched']}"
    return f"{json.dumps(_plain(result.get('observed_value')))}"


def _describe(validation: dict[str, Any], suite: str) -> tuple[dict[str, Any], str | None]:
    config = validation["expectation_config"]
    kwargs = {k: v for k, v in config["kwargs"].items() if k not in ("batch_id", "result_format")}
    target = kwargs.get("column") or ", ".join(
        str(kwargs[k]) for k in ("column_A", "column_B") if k in kwargs
    )
    exception = (validation.get("exception_info") or {}).get("exception_message")
    observed = f"error: {exception}" if exception else _observed(validation["result"])
    entry = {
        "expectation": config["type"],
        "target": target,
        "success": bool(validation["success"]),
        "observed": observed,
        "kwargs": _plain(kwargs),
        "meta": _plain(config.get("meta") or {}),
    }
    if entry["success"]:
        return entry, None
    why = (config.get("meta") or {}).get("why")
    template = _EXPECTED.get(config["type"])
    try:
        expected = template.format(**kwargs) if template else json.dumps(entry["kwargs"])
    except KeyError:
        expected = json.dumps(entry["kwargs"])
    because = f" ({why})" if why else ""
    return entry, f"{suite}: {config['type']}({target}): observed {observed}; expected {expected}{because}"


def _parameters(checks: list[GateCheck]) -> dict[str, Any]:
    """The checks' parameters as the one dict a Checkpoint takes (a name means one value)."""
    merged: dict[str, Any] = {}
    for check in checks:
        for name, value in check.parameters.items():
            if name in merged and merged[name] != value:
                raise ValueError(f"gate parameter {name!r} has two values: {merged[name]!r} and {value!r}")
            merged[name] = value
    return merged


def _write_frame(check: GateCheck, path: Path) -> None:
    frame = check.frame.to_pandas()
    if check.index_columns and check.frame.num_rows:
        columns = [check.frame.column(c).to_pylist() for c in check.index_columns]
        frame.index = [
            json.dumps(dict(zip(check.index_columns, values, strict=True)), default=str)
            for values in zip(*columns, strict=True)
        ]
        frame.index.name = ROW
    frame.to_parquet(path)


def run_gate(
    checks: Iterable[GateCheck], run_name: str, coverage: Coverage, docs_dir: Path | None = None
) -> GateOutcome:
    """Validate every check in one GX Checkpoint run named ``run_name``; with ``docs_dir``, its
    ``UpdateDataDocsAction`` writes the Data Docs site there."""
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import ProgressBarsConfig

    checks = list(checks)
    # GX logs at INFO what it does on every context; one of its loggers sets its own level
    # (INFO, at import), so it is quieted by name: the stage's own log line says what ran
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    actions = []
    if docs_dir is not None:
        context.add_data_docs_site(
            site_name=DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        actions.append(UpdateDataDocsAction(name="update_data_docs", site_names=[DOCS_SITE]))
    with tempfile.TemporaryDirectory(prefix="tokenlake-gate-") as frames:
        datasource = context.data_sources.add_pandas("tokenlake")
        definitions = []
        for check in checks:
            path = Path(frames) / f"{check.suite}.parquet"
            _write_frame(check, path)
            batch = datasource.add_parquet_asset(
                check.suite, path=str(path)
            ).add_batch_definition_whole_dataframe(check.suite)
            stored = load_suite(check.suite)
            # GX shows a suite's notes on its Data Docs page: what this run read comes first
            notes = f"This run {coverage.sentence()}. {stored.pop('notes', '')}".strip()
            suite = context.suites.add(gx.ExpectationSuite(**stored, notes=notes))
            definitions.append(
                context.validation_definitions.add(
                    gx.ValidationDefinition(name=check.suite, data=batch, suite=suite)
                )
            )
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=run_name,
                validation_definitions=definitions,
                actions=actions,
                result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5},
            )
        )
        result = checkpoint.run(
            expectation_parameters=_parameters(checks),
            run_id=RunIdentifier(run_name=run_name, run_time=datetime.datetime.now(datetime.UTC)),
        )
    by_suite = {key.expectation_suite_identifier.name: value for key, value in result.run_results.items()}
    suites, failures = [], []
    for check in checks:
        validated = by_suite[check.suite].to_json_dict()
        entries = []
        for validation in validated["results"]:
            entry, failure = _describe(validation, check.suite)
            entries.append(entry)
            if failure:
                failures.append(failure)
        suites.append(
            {
                "suite": check.suite,
                "success": bool(validated["success"]),
                "evaluated": len(entries),
                "rows": check.frame.num_rows,
                "expectations": entries,
            }
        )
    return GateOutcome(
        not failures, suites, failures, run_name, coverage, str(docs_dir) if docs_dir else None
    )


def publish_data_docs(repo: DataRepo, branch: str, stage: str, docs_dir: Path) -> list[str]:
    """Put the Data Docs pages (HTML, styles, the local Bootstrap and jQuery, favicon; not GX's
    unused images and fonts) under ``reports/data_docs/<stage>/`` on ``branch``."""
    prefix = layout.data_docs_folder(stage)
    clear_prefix(repo, branch, prefix)
    paths = []
    for path in sorted(docs_dir.rglob("*")):
        rel = path.relative_to(docs_dir).as_posix()
        if path.is_file() and (path.suffix in (".html", ".css", ".js") or path.name == "favicon.ico"):
            repo.put(branch, f"{prefix}/{rel}", str(path))
            paths.append(f"{prefix}/{rel}")
    return paths


def gate_stage(
    repo: DataRepo,
    branch: str,
    report: StageReport,
    input_commit: str,
    checks: list[GateCheck],
    coverage: Coverage,
) -> GateOutcome:
    """Run a stage's suites on what it wrote, put Data Docs under ``reports/``, and fail the
    stage on a failed gate (its report and Data Docs left uncommitted on the branch, for a
    person to read; the flow discards the branch)."""
    stage = report.stage
    run_name = f"{stage}-{input_commit[:12]}-{coverage.run_name_part()}"
    # kept where a person finds them if the gate fails (the run branch holding them is deleted)
    failed_docs = data_home() / "data-docs" / "failed"
    failed_docs.mkdir(parents=True, exist_ok=True)
    docs_dir = Path(tempfile.mkdtemp(prefix=f"{run_name}-", dir=failed_docs))
    outcome = run_gate(checks, run_name, coverage, docs_dir)
    make_offline(docs_dir)
    report.expectations = outcome.to_dict()
    report.commit_metadata |= outcome.metadata()
    publish_data_docs(repo, branch, stage, docs_dir)
    report.extra["data_docs"] = f"{layout.data_docs_folder(stage)}/index.html"
    if not outcome.success:
        put_json(repo, branch, layout.report_path(stage), report.to_dict())
        outcome.raise_if_failed(stage)
    shutil.rmtree(docs_dir, ignore_errors=True)
    return outcome


class DocumentSample:
    """The documents a gate checks: every one up to ``max_rows``, then the ``max_rows`` with the
    smallest ids (ids are sha256 hex, so that is a uniform, deterministic sample)."""

    def __init__(self, max_rows: int, columns: list[str]):
        self.max_rows = max_rows
        self.columns = columns
        self.total = 0
        self._tables: list[pa.Table] = []
        self._rows = 0

    def add(self, table: pa.Table) -> None:
        self.total += table.num_rows
        if table.num_rows == 0 or self.max_rows == 0:
            return
        text = table.column("text")
        slim = table.select(self.columns).set_column(
            self.columns.index("text"), "text", pc.utf8_slice_codeunits(text, 0, GATE_TEXT_CHARS)
        )
        self._keep(slim.append_column("text_chars", pc.utf8_length(text).cast(pa.int64())))

    def absorb(self, sample: pa.Table | None, total: int) -> None:
        """Another sample's :meth:`table` (of a partition that saw ``total`` documents): the
        bottom-k of the union is the bottom-k of the union of the bottom-k's, so partitions
        sample on their workers and only their samples travel."""
        self.total += total
        if sample is not None and sample.num_rows and self.max_rows:
            self._keep(sample)

    def _keep(self, slim: pa.Table) -> None:
        self._tables.append(slim)
        self._rows += slim.num_rows
        if self._rows > self.max_rows + max(self.max_rows // 4, 1_000):
            self._compact()

    def _compact(self) -> None:
        merged = pa.concat_tables(self._tables)
        if merged.num_rows > self.max_rows:
            merged = merged.take(pc.sort_indices(merged, [("id", "ascending")])[: self.max_rows])
        self._tables, self._rows = [merged], merged.num_rows

    def table(self, schema: pa.Schema) -> pa.Table:
        """The sample; ``schema`` (the slim columns + text_chars) gives an empty sample its columns."""
        if not self._tables:
            return schema.empty_table()
        self._compact()
        return self._tables[0]

    def coverage(self) -> Coverage:
        return Coverage(min(self.total, self.max_rows), self.total, "documents")


def stats_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The per-source, per-rule table the stage_stats suite checks (see :func:`stats_rows`)."""
    return pa.Table.from_pylist(rows, schema=STATS_SCHEMA)


def stats_rows(
    source: str,
    documents_in: int,
    kept: int,
    failed: dict[str, int],
    rate_range: Callable[[str], tuple[float, float]],
) -> list[dict[str, Any]]:
    """The stage_stats rows of one source: one per rule with the documents that failed it,
    and a ``total`` row with every document not kept; ``rate_range(rule)`` gives the rule's
    allowed (min, max) removal rate."""
    quarantined = documents_in - kept
    rows = []
    for rule, count in [*failed.items(), ("total", quarantined)]:
        low, high = rate_range(rule)
        rows.append(
            {
                "source": source,
                "rule": rule,
                "documents_in": documents_in,
                "kept": kept,
                "quarantined": quarantined,
                "accounted": kept + quarantined,
                "removed": count,
                "removal_rate": count / documents_in if documents_in else 0.0,
                "min_removal_rate": low,
                "max_removal_rate": high,
            }
        )
    return rows
