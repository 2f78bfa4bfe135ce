"""The quality filters as one pure function over an Arrow batch: signals in, keep or drop with
the first failing rule as the reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.quality.classifier import QualityScorer, pareto_keep
from tasks.quality.code import CODE_RULES, code_signals
from tasks.quality.langid import identify
from tasks.quality.prose import PROSE_RULES, prose_signals
from tasks.quality.rules import first_failures
from tasks.schema import with_quarantine_reason
from tasks.validate.config import CLASSIFIER_RULE, LANGUAGE_RULE, ValidateConfig

STAGE = "validate"
SIGNAL_FIELDS = [
    *(pa.field(f"q_{rule}", pa.float64()) for rule in (*PROSE_RULES, *CODE_RULES)),
    pa.field("lang", pa.string()),
    pa.field("lang_score", pa.float64()),
    pa.field("quality_score", pa.float64()),
]
"""Columns validate adds to every document, the same for every source (null where a signal
does not apply to the source's kind)."""


@dataclass
class FilterStats:
    """Counts of one source: ``removed`` by first failing rule (these add up), ``failed`` by
    every rule a document fails (the per-rule removal rate the gate bounds)."""

    documents_in: int = 0
    kept: int = 0
    removed: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    rules: list[str] = field(default_factory=list)

    def add(self, other: FilterStats) -> None:
        self.documents_in += other.documents_in
        self.kept += other.kept
        self.removed.update(other.removed)
        self.failed.update(other.failed)
        self.rules = self.rules or other.rules


@dataclass(frozen=True)
class ClassifierRule:
    """A trained scorer and whether its keep rule applies to this source."""

    scorer: QualityScorer
    apply_keep: bool


def apply_filters(
    table: pa.Table,
    source: str,
    kind: str,
    config: ValidateConfig,
    classifier: ClassifierRule | None = None,
) -> tuple[pa.Table, pa.Table, FilterStats]:
    """``(kept, quarantined, stats)`` for a batch of one source's documents.

    Both tables are the input columns plus the signal columns; the quarantined one adds
    ``stage`` and ``reason`` (the first rule the document fails).
    """
    n = table.num_rows
    texts = table.column("text").combine_chunks()
    signals: dict[str, Any] = {f.name: None for f in SIGNAL_FIELDS}
    rule_signals = prose_signals(texts) if kind == "prose" else code_signals(texts)
    signals.update({f"q_{rule}": values for rule, values in rule_signals.items()})
    bounds = config.rules_for(source, kind)
    failures = {rule: bound.fails(rule_signals[rule]) for rule, bound in bounds.items() if bound.active}

    if config.langid.enabled and kind in config.langid.kinds:
        langs, scores = identify(texts, config.langid.max_chars)
        signals["lang"], signals["lang_score"] = langs, scores
        if config.langid.keep:
            known = np.asarray(
                pc.is_in(langs, value_set=pa.array(config.langid.keep)).to_numpy(zero_copy_only=False)
            )
            failures[LANGUAGE_RULE] = ~(known & (scores >= config.langid.min_score))

    if classifier is not None and kind in config.classifier.kinds:
        quality = classifier.scorer.score(texts)
        signals["quality_score"] = quality
        if classifier.apply_keep and config.classifier.keep == "threshold":
            failures[CLASSIFIER_RULE] = quality < config.classifier.threshold
        elif classifier.apply_keep and config.classifier.keep == "pareto":
            failures[CLASSIFIER_RULE] = ~pareto_keep(
                table.column("id"), quality, config.classifier.pareto_alpha
            )

    for f in SIGNAL_FIELDS:
        values = signals[f.name]
        table = table.append_column(f, pa.nulls(n, f.type) if values is None else pa.array(values, f.type))
    reasons = first_failures(failures, n)
    keep = pa.array(reasons == None)  # noqa: E711 - elementwise comparison on an object array
    dropped = np.asarray([r for r in reasons if r is not None], dtype=object)
    stats = FilterStats(
        documents_in=n,
        kept=n - len(dropped),
        removed=Counter(dropped.tolist()),
        failed=Counter({rule: int(failed.sum()) for rule, failed in failures.items()}),
        rules=list(failures),
    )
    quarantined = with_quarantine_reason(table.filter(pc.invert(keep)), STAGE, dropped.tolist())
    return table.filter(keep), quarantined, stats
