"""One curate stage, written the same way for every stage.

Each stage package (``tasks/<stage>/``) has the same three parts:

* a pure core over Arrow tables (``ingest_partition``, ``apply_filters``, ``apply_plan``,
  ``pack_source``, ``resolve_mix``): no repository, no Prefect;
* ``run_<stage>(repo, branch, input_commit, config) -> StageReport`` in ``stage.py``: reads the
  input at the commit id, feeds the core, and writes through a :class:`StageWriter`, which
  owns the part writers, the quarantine writer and the per-source counts;
* ``<stage>_task`` in ``task.py``: the Prefect task, a few lines around
  :func:`tasks.stage_task.run_stage_task`.

:func:`run_stage` runs a stage and ends it in its commit (what the task does, without
Prefect). A stage first clears its outputs on the branch, so a retry never duplicates
documents; ``reports/<stage>.json`` and the commit balance documents in = kept + rejected.
``docs/interfaces.md`` shows the shortest stage, ``tasks/mix/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pyarrow as pa

from formats import layout
from tasks.gates import (
    Coverage,
    DocumentSample,
    GateCheck,
    GateOutcome,
    GateSettings,
    gate_stage,
    stats_rows,
    stats_table,
)
from tasks.parts import PartWriter, clear_prefix, put_json, put_table
from tasks.report import DocumentCounts, StageReport
from versioning import DataRepo

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A misconfiguration found before any work; the message names what to fix."""


def tokenlake_version() -> str:
    try:
        return version("tokenlake")
    except PackageNotFoundError:
        return "0+unknown"


def config_hash(config: Any) -> str:
    """A short, stable hash of a stage config (pydantic model, dataclass or plain data)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    elif hasattr(config, "__dataclass_fields__"):
        config = asdict(config)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StageResult:
    """What a stage task returns to the flow: the commit that ended it, its report, and the flow
    run that computed it (a reused result names the run that did the work)."""

    stage: str
    commit_id: str
    report: dict[str, Any]
    flow_run_id: str = ""


@dataclass
class PartitionOutput(DocumentCounts):
    """What one partition of a stage wrote and counted: the small report a worker returns.

    The partition's documents went to the repository (``parts`` are the kept parts it wrote);
    ``sample`` is the bottom-k of its kept documents for the gate (see
    :meth:`tasks.gates.DocumentSample.absorb`); ``facts`` are the stage's own numbers.
    """

    source: str = field(kw_only=True)
    parts: list[str] = field(default_factory=list)
    sample: pa.Table | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def write_partition(
    repo: DataRepo,
    branch: str,
    stage: str,
    documents: str,
    source: str,
    part: str,
    kept: pa.Table,
    quarantined: pa.Table,
    sample_rows: int = 0,
    sample_columns: list[str] | None = None,
) -> PartitionOutput:
    """Write one partition's kept and quarantined documents as ``<documents>/<source>/<part>`` and
    ``quarantine/<stage>/<source>/<part>`` (each only when it has rows) and count them.

    The part name comes from the partition (its input part, or its index), so what a worker
    writes does not depend on which worker ran it or when.
    """
    output = PartitionOutput(source=source)
    if kept.num_rows:
        path = f"{layout.source_folder(documents, source)}/{part}"
        put_table(repo, branch, path, kept)
        output.parts.append(path)
    if quarantined.num_rows:
        put_table(repo, branch, f"{layout.quarantine_folder(stage, source)}/{part}", quarantined)
    output.documents_in = kept.num_rows + quarantined.num_rows
    output.kept = kept.num_rows
    for reason, count in Counter(quarantined.column("reason").to_pylist()).items():
        output.reject(reason, count)
    if sample_rows and sample_columns and kept.num_rows:
        sample = DocumentSample(sample_rows, sample_columns)
        sample.add(kept)
        output.sample = sample.table(pa.schema([]))
    return output


class SourceOutput(DocumentCounts):
    """One source's share of a stage: its kept parts, its quarantine parts and its counts.

    ``facts`` are the source's other report fields (kind, shards, ...), next to the counts in
    ``per_source``.
    """

    def __init__(
        self, name: str, kept: PartWriter | None, quarantine: PartWriter, sample: DocumentSample | None
    ):
        super().__init__()
        self.name = name
        self._kept = kept
        self._quarantine = quarantine
        self._sample = sample
        self._partition_parts: list[str] = []
        self.facts: dict[str, Any] = {}

    def write(self, kept: pa.Table, quarantined: pa.Table) -> None:
        """One batch out of the core: every document it read is in exactly one of the tables."""
        assert self._kept is not None, "this stage writes no documents; count() what it keeps"
        self._kept.write(kept)
        if self._sample is not None:
            self._sample.add(kept)
        self.documents_in += kept.num_rows + quarantined.num_rows
        self.kept += kept.num_rows
        self.quarantine(quarantined)

    def quarantine(self, table: pa.Table) -> None:
        """Rejected documents, each with its ``reason``: written to the quarantine and counted."""
        self._quarantine.write(table)
        for reason, count in Counter(table.column("reason").to_pylist()).items():
            self.reject(reason, count)

    def absorb(self, partition: PartitionOutput) -> None:
        """A partition that a worker wrote: its counts, its parts and its sample join the source's."""
        self.add(partition)
        self._partition_parts += partition.parts
        if self._sample is not None:
            self._sample.absorb(partition.sample, partition.kept)

    def count(
        self, *, documents_in: int = 0, kept: int = 0, rejected: Mapping[str, int] | None = None
    ) -> None:
        """Documents a core counted but did not hand over as rows: those it read, those kept as
        something else (tokens), those rejected without a row to quarantine."""
        self.add(DocumentCounts(documents_in, kept, dict(rejected or {})))

    def _close(self) -> None:
        if self._kept is not None:
            self._kept.close()
            self.facts.setdefault("parts", len(self._kept.paths) + len(self._partition_parts))
        self._quarantine.close()


class StageWriter:
    """The shared part of every ``run_<stage>``: clears the stage's outputs on the branch,
    gives each source a :class:`SourceOutput`, adds up the report, runs the gate.

    ``documents`` is the folder the stage writes its kept documents to (``raw``,
    ``filtered``, ``dedup``), or None for a stage whose output is something else; ``sample``
    collects what the stage's document gate reads.
    """

    def __init__(
        self,
        repo: DataRepo,
        branch: str,
        stage: str,
        *,
        documents: str | None = None,
        rows_per_part: int = 50_000,
        clear: Iterable[str] = (),
        sample: DocumentSample | None = None,
    ):
        self.repo, self.branch, self.stage = repo, branch, stage
        self.documents = documents
        self.rows_per_part = rows_per_part
        self.sample = sample
        self._started = time.perf_counter()
        owned = [layout.quarantine_folder(stage), layout.data_docs_folder(stage), *clear]
        for prefix in [documents, *owned] if documents else owned:
            clear_prefix(repo, branch, prefix)
        self.report = StageReport(stage=stage)

    @contextmanager
    def source(self, name: str) -> Iterator[SourceOutput]:
        """One source's outputs; its counts join the report when the block ends."""
        kept = None
        if self.documents:
            kept = PartWriter(
                self.repo, self.branch, layout.source_folder(self.documents, name), self.rows_per_part
            )
        quarantine = PartWriter(
            self.repo, self.branch, layout.quarantine_folder(self.stage, name), self.rows_per_part
        )
        out = SourceOutput(name, kept, quarantine, self.sample)
        yield out
        out._close()
        out.check_balance(f"stage {self.stage}, source {name}")
        self.report.add(out)
        self.report.per_source[name] = {
            "documents_in": out.documents_in,
            "kept": out.kept,
            "rejected": dict(out.rejected),
            **out.facts,
        }
        log.info(
            "%s %s: %d in, %d kept, rejected %s", self.stage, name, out.documents_in, out.kept, out.rejected
        )

    def gate(self, input_commit: str, checks: list[GateCheck], coverage: Coverage) -> GateOutcome:
        """Run the stage's expectation suites (raises ExpectationsFailed, nothing committed)."""
        return gate_stage(self.repo, self.branch, self.report, input_commit, checks, coverage)

    def gate_documents(
        self,
        input_commit: str,
        settings: GateSettings,
        suite: str,
        schema: pa.Schema,
        parameters: dict[str, Any],
        failed: Mapping[str, Mapping[str, int]],
        rate_range: Callable[[str], tuple[float, float]],
    ) -> None:
        """The gate of a document stage: ``suite`` on the sample of kept documents (``schema``
        gives an empty sample its columns), and ``stage_stats`` on each source's counts, where
        ``failed[source][rule]`` documents failed a rule whose removal rate must lie in
        ``rate_range(rule)``. Switched off by ``settings``, it is recorded as disabled."""
        if not settings.enabled:
            self.report.commit_metadata["gate"] = "disabled"
            return
        assert self.sample is not None, "a document gate reads the StageWriter's sample"
        stats = [
            row
            for source, counts in self.report.per_source.items()
            for row in stats_rows(
                source, counts["documents_in"], counts["kept"], dict(failed[source]), rate_range
            )
        ]
        checks = [
            GateCheck(suite, self.sample.table(schema), parameters, ["locator"]),
            GateCheck("stage_stats", stats_table(stats), {}, ["source", "rule"]),
        ]
        self.gate(input_commit, checks, self.sample.coverage())

    def finish(self) -> StageReport:
        """The report, with the stage's time so far."""
        self.report.seconds = round(time.perf_counter() - self._started, 3)
        return self.report


def stage_metadata(
    stage: str, stage_config_hash: str, input_commit: str, flow_run_id: str | None, report: StageReport
) -> dict[str, str]:
    """Commit metadata every stage commit carries (DESIGN.md section 3)."""
    return {
        "stage": stage,
        "stage_config_hash": stage_config_hash,
        "input_commit": input_commit,
        "flow_run_id": flow_run_id or "",
        "tokenlake_version": tokenlake_version(),
        "documents_in": str(report.documents_in),
        "kept": str(report.kept),
        "rejected": str(report.rejected_total),
        "tokens": str(report.tokens),
    }


def commit_stage(
    repo: DataRepo,
    branch: str,
    report: StageReport,
    stage_config_hash: str,
    input_commit: str,
    flow_run_id: str | None = None,
) -> str:
    """Write ``reports/<stage>.json`` and commit the stage; returns the commit id."""
    report.check_balance(f"stage {report.stage}")
    put_json(repo, branch, layout.report_path(report.stage), report.to_dict())
    meta = (
        stage_metadata(report.stage, stage_config_hash, input_commit, flow_run_id, report)
        | report.commit_metadata
    )
    # allow_empty: a retried stage may rewrite byte-identical outputs, and every stage still
    # ends in its own commit (the next stage's input, and the stage's cache entry)
    return repo.commit(branch, commit_message(report), meta, allow_empty=True).id


def commit_message(report: StageReport) -> str:
    """``<stage>: kept K of N``; a stage that reads no documents (mix reads the manifest) says
    what it made instead of "kept 0 of 0"."""
    if report.documents_in or report.rejected_total or not report.note:
        return f"{report.stage}: kept {report.kept} of {report.documents_in}"
    return f"{report.stage}: {report.note}"


StageFunction = Callable[..., StageReport]
"""``run_<stage>(repo, branch, input_commit, config, **options) -> StageReport``."""


def run_stage(
    run: StageFunction,
    repo: DataRepo,
    branch: str,
    input_commit: str,
    config: Any,
    flow_run_id: str | None = None,
    **options: Any,
) -> StageResult:
    """Run a stage and end it in its commit: what every ``<stage>_task`` does, without Prefect."""
    report = run(repo, branch, input_commit, config, **options)
    commit_id = commit_stage(repo, branch, report, config_hash(config), input_commit, flow_run_id)
    return StageResult(report.stage, commit_id, report.to_dict(), flow_run_id or "")
