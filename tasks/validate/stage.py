"""The validate stage: ``raw/`` at the input commit through the quality filters into
``filtered/<source>/`` and ``quarantine/validate/<source>/``, gated by
``expectations/filtered_documents.json`` and ``expectations/stage_stats.json``.

Which sources exist, their kind and whether they are reference sources come from the
ingest stage's report (``reports/ingest.json`` at the input commit): facts fixed at ingest.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from formats import layout
from tasks.gates import DocumentSample
from tasks.partition_map import partitions
from tasks.parts import iter_batches, list_parts, read_part, read_parts
from tasks.quality.classifier import load_factory
from tasks.quality.code import CODE_RULES
from tasks.quality.langid import check_languages
from tasks.quality.prose import PROSE_RULES
from tasks.schema import DOCUMENT_SCHEMA
from tasks.stage import ConfigError, PartitionOutput, StageReport, StageWriter, write_partition
from tasks.validate.config import ValidateConfig
from tasks.validate.filters import SIGNAL_FIELDS, STAGE, ClassifierRule, FilterStats, apply_filters
from versioning import DataRepo, NotFound

MODEL_PATH = layout.QUALITY_CLASSIFIER
GATE_COLUMNS = ["id", "source", "text", "locator", "meta", *(f.name for f in SIGNAL_FIELDS)]
GATE_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, *SIGNAL_FIELDS, pa.field("text_chars", pa.int64())])


class ValidateConfigError(ConfigError):
    """A validate misconfiguration found before any work; the message names what to fix."""


def read_sources(repo: DataRepo, input_commit: str) -> dict[str, dict[str, Any]]:
    """Source name -> {kind, reference, kept} as the ingest stage recorded them."""
    try:
        ingest = json.loads(repo.get(input_commit, layout.report_path("ingest")))
    except NotFound:
        raise ValidateConfigError(
            f"input commit {input_commit[:12]} has no {layout.report_path('ingest')}; run the ingest stage first"
        ) from None
    return {
        name: {"kind": s["kind"], "reference": s["reference"], "kept": s["kept"]}
        for name, s in ingest["per_source"].items()
    }


def check_config(config: ValidateConfig, sources: dict[str, dict[str, Any]]) -> None:
    """Fail fast on overrides for sources or rules that do not fit the input."""
    for name, overrides in config.per_source.items():
        if name not in sources:
            raise ValidateConfigError(
                f"per_source names {name!r}, which is not an ingested source ({', '.join(sources)})"
            )
        kind = sources[name]["kind"]
        foreign = sorted(set(overrides) - set(PROSE_RULES if kind == "prose" else CODE_RULES))
        if foreign:
            raise ValidateConfigError(f"per_source[{name!r}] sets {foreign}, which are not {kind} rules")
    try:
        check_languages(config.langid)
    except ValueError as exc:
        raise ValidateConfigError(str(exc)) from None


def _bottom_k_texts(repo: DataRepo, ref: str, sources: list[str], k: int) -> pa.Array:
    """The texts of the ``k`` documents with the smallest ids among ``sources``: a uniform,
    deterministic sample read one part at a time."""
    sample = None
    for source in sources:
        for part in read_parts(repo, ref, layout.source_folder(layout.RAW, source), columns=["id", "text"]):
            sample = part if sample is None else pa.concat_tables([sample, part])
            if sample.num_rows > 2 * k:
                sample = sample.sort_by("id").slice(0, k)
    if sample is None:
        return pa.array([], pa.string())
    return sample.sort_by("id").slice(0, k).column("text").combine_chunks()


def train_classifier(
    repo: DataRepo, input_commit: str, config: ValidateConfig, sources: dict[str, dict[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    """``(scorer or None, facts for the report)``: GPT-3 style, reference sources are the positives."""
    settings = config.classifier
    eligible = {n: s for n, s in sources.items() if s["kind"] in settings.kinds and s["kept"]}
    positives = sorted(n for n, s in eligible.items() if s["reference"])
    negatives = sorted(n for n, s in eligible.items() if not s["reference"])
    if not settings.enabled:
        return None, {"active": False, "why": "classifier.enabled is false"}
    if not positives or not negatives:
        why = "no source is marked reference" if not positives else "every source is a reference source"
        return None, {"active": False, "why": f"{why} (among kinds {settings.kinds})"}
    factory = load_factory(settings.factory)
    scorer = factory(
        _bottom_k_texts(repo, input_commit, positives, settings.max_training_docs),
        _bottom_k_texts(repo, input_commit, negatives, settings.max_training_docs),
        settings,
    )
    facts = {
        "active": True,
        "positive_sources": positives,
        "negative_sources": negatives,
        **scorer.describe(),
    }
    return scorer, facts


@dataclass(frozen=True)
class ValidateWork:
    """One input part of one source, as a worker gets it."""

    repo: DataRepo
    branch: str
    input_commit: str
    source: str
    kind: str
    path: str  # raw/<source>/part-NNNNN.parquet
    config: ValidateConfig
    rule: ClassifierRule | None


def validate_one(work: ValidateWork) -> PartitionOutput:
    """One raw part through the filters into ``filtered/<source>/`` under the same part name."""
    table = read_part(work.repo, work.input_commit, work.path)
    kept, quarantined, totals, languages = [], [], FilterStats(), Counter()
    for batch in iter_batches([table], work.config.batch_rows):
        k, q, stats = apply_filters(batch, work.source, work.kind, work.config, work.rule)
        kept.append(k)
        quarantined.append(q)
        totals.add(stats)
        languages.update(lang for lang in k.column("lang").to_pylist() if lang is not None)
    output = write_partition(
        work.repo,
        work.branch,
        STAGE,
        layout.FILTERED,
        work.source,
        work.path.rsplit("/", 1)[1],
        pa.concat_tables(kept, promote_options="default") if kept else pa.table({}),
        pa.concat_tables(quarantined, promote_options="default")
        if quarantined
        else pa.table({"reason": pa.array([], pa.string())}),
        work.config.gate.max_rows,
        GATE_COLUMNS,
    )
    output.facts = {"failed": dict(totals.failed), "rules": totals.rules, "languages": dict(languages)}
    return output


def run_validate(repo: DataRepo, branch: str, input_commit: str, config: ValidateConfig) -> StageReport:
    """Filter every ingested source onto ``branch``; ValidateConfigError before any work,
    ExpectationsFailed (nothing committed) when the output breaks its expectations."""
    sources = read_sources(repo, input_commit)
    check_config(config, sources)
    if config.classifier.enabled:
        try:
            load_factory(config.classifier.factory)
        except ValueError as exc:
            raise ValidateConfigError(str(exc)) from None

    sample = DocumentSample(config.gate.max_rows, GATE_COLUMNS)
    stage = StageWriter(repo, branch, STAGE, documents=layout.FILTERED, sample=sample)
    scorer, stage.report.extra["classifier"] = train_classifier(repo, input_commit, config, sources)
    if scorer is not None and (model := scorer.to_bytes()) is not None:
        repo.put(branch, MODEL_PATH, model)
    work = []
    for name, source in sources.items():
        rule = None
        if scorer is not None:
            rule = ClassifierRule(
                scorer, apply_keep=config.classifier.filter_reference or not source["reference"]
            )
        for path in list_parts(repo, input_commit, layout.source_folder(layout.RAW, name)):
            work.append(ValidateWork(repo, branch, input_commit, name, source["kind"], path, config, rule))
    outputs = list(
        partitions().map(
            "validate-part", validate_one, work, describe=lambda w: f"{w.path} at {input_commit[:12]}"
        )
    )

    failed: dict[str, dict[str, int]] = {}  # source -> rule -> documents failing it
    for name, source in sources.items():
        rules, failures, languages = [], Counter(), Counter()
        with stage.source(name) as out:
            for output in outputs:
                if output.source == name:
                    out.absorb(output)
                    rules = rules or output.facts["rules"]
                    failures.update(output.facts["failed"])
                    languages.update(output.facts["languages"])
            failed[name] = {rule_name: failures.get(rule_name, 0) for rule_name in rules}
            out.facts |= {
                "kind": source["kind"],
                "reference": source["reference"],
                "failed": failed[name],
                "kept_languages": dict(languages.most_common(10)),
            }

    with_documents = [n for n, s in sources.items() if s["kept"]]
    documents = {"sources": with_documents, "max_text_chars": config.gate.max_text_chars}
    stage.gate_documents(
        input_commit,
        config.gate,
        "filtered_documents",
        GATE_SCHEMA,
        documents,
        failed,
        config.gate.rate_range,
    )
    report = stage.finish()
    report.note = "classifier trained" if scorer is not None else "classifier off"
    report.commit_metadata["classifier"] = "trained" if scorer is not None else "off"
    return report
