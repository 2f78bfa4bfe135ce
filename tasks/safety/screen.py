"""The safety checks as one pure function over an Arrow batch: blocked URLs, benchmark
contamination, personal data and secrets.

Redaction comes first and applies to every document, kept or quarantined, so no copy of a
found secret is written anywhere (the quarantine keeps the reason and the redacted text).
Then each document gets at most one reason, in this order: ``blocked_url``, ``contaminated``,
``secret`` (a credential type in quarantine mode), ``pii`` (a personal type in quarantine mode).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.safety.blocklist import Blocklist
from tasks.safety.config import SECRET_TYPES, SafetyConfig
from tasks.safety.decontaminate import BenchmarkSet, Contamination, find_contamination, remove_spans
from tasks.safety.pii import find_pii, redact_texts
from tasks.safety.words import BatchBytes, batch_bytes
from tasks.schema import with_quarantine_reason
from tasks.text_bytes import one_array

STAGE = "safety"


@dataclass(frozen=True)
class SafetyChecks:
    """What a worker needs besides the documents: the built benchmark set and blocklist."""

    config: SafetyConfig
    benchmarks: BenchmarkSet | None = None
    blocklist: Blocklist | None = None


@dataclass
class SafetyStats:
    """One source's (or batch's) counts for the report."""

    pii_found: Counter = field(default_factory=Counter)  # type -> occurrences
    pii_documents: Counter = field(default_factory=Counter)  # type -> documents holding it
    redacted_documents: int = 0  # kept documents with at least one placeholder
    contaminated: Counter = field(default_factory=Counter)  # benchmark -> documents
    contaminated_ngrams: Counter = field(default_factory=Counter)  # benchmark -> n-gram matches
    spans_removed: int = 0
    documents_cut: int = 0  # remove mode: documents kept without their contaminated spans
    blocked: Counter = field(default_factory=Counter)  # list -> documents
    no_url: int = 0

    def add(self, other: SafetyStats) -> None:
        for name in ("pii_found", "pii_documents", "contaminated", "contaminated_ngrams", "blocked"):
            getattr(self, name).update(getattr(other, name))
        for name in ("redacted_documents", "spans_removed", "documents_cut", "no_url"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pii": {
                kind: {"found": self.pii_found[kind], "documents": self.pii_documents[kind]}
                for kind in sorted(self.pii_found)
            },
            "redacted_documents": self.redacted_documents,
            "contaminated": {
                name: {"documents": self.contaminated[name], "ngrams": self.contaminated_ngrams[name]}
                for name in sorted(self.contaminated)
            },
            "spans_removed": self.spans_removed,
            "documents_cut": self.documents_cut,
            "blocked": dict(sorted(self.blocked.items())),
            "no_url": self.no_url,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SafetyStats:
        stats = cls()
        for kind, counts in data["pii"].items():
            stats.pii_found[kind], stats.pii_documents[kind] = counts["found"], counts["documents"]
        for name, counts in data["contaminated"].items():
            stats.contaminated[name], stats.contaminated_ngrams[name] = counts["documents"], counts["ngrams"]
        stats.blocked.update(data["blocked"])
        for name in ("redacted_documents", "spans_removed", "documents_cut", "no_url"):
            setattr(stats, name, data[name])
        return stats


def _replaced(column: pa.Array, texts: dict[int, str]) -> pa.Array:
    """``column`` with the texts at the given indices replaced."""
    if not texts:
        return column
    mask = np.zeros(len(column), bool)
    mask[list(texts)] = True
    return pc.replace_with_mask(
        column, pa.array(mask), pa.array([texts[i] for i in sorted(texts)], column.type)
    )


def _contamination(
    column: pa.Array, benchmarks: BenchmarkSet, batch: BatchBytes | None, redacted: list[int]
) -> Contamination:
    """``find_contamination`` of ``column``, reading ``batch`` (the bytes before redaction) for
    the texts PII left alone and the redacted texts' own bytes for the others."""
    if not redacted:
        return find_contamination(column, benchmarks, batch)
    skip = np.zeros(len(column), np.bool_)
    skip[redacted] = True
    found = find_contamination(column, benchmarks, batch, skip)
    changed = find_contamination(column.take(pa.array(redacted, pa.int64())), benchmarks)
    for local, index in enumerate(redacted):
        if local in changed.detail:
            found.detail[index] = changed.detail[local]
            found.benchmarks[index] = changed.benchmarks[local]
    found.ngrams.update(changed.ngrams)
    return found


def apply_safety(table: pa.Table, checks: SafetyChecks) -> tuple[pa.Table, pa.Table, SafetyStats]:
    """``(kept, quarantined, stats)`` of a batch; the quarantined table adds ``stage``,
    ``reason`` and ``detail``."""
    config, stats = checks.config, SafetyStats()
    n = table.num_rows
    reasons: list[str | None] = [None] * n
    details: list[str] = [""] * n
    column = original = one_array(table.column("text"))

    modes = config.pii.active()
    reads_bytes = bool(modes) or checks.benchmarks is not None  # a blocklist alone reads metas only
    batch = batch_bytes(column) if reads_bytes else None  # the bitmaps both PII and decontamination read
    findings = find_pii(column, config.pii, batch) if modes else None
    if findings is not None:
        stats.pii_found.update(findings.counts)
        for index, spans in findings.spans.items():
            kinds = Counter(kind for _, _, kind in spans)
            stats.pii_documents.update(kinds.keys())
            held = sorted(k for k in kinds if modes[k] == "quarantine")
            if held:
                reasons[index] = "secret" if any(k in SECRET_TYPES for k in held) else "pii"
                found = ", ".join(f"{k} x{c}" for k, c in sorted(kinds.items()))
                details[index] = (
                    f"found {found}; quarantined for {', '.join(held)}; the text here is redacted"
                )
        column = redact_texts(column, findings, batch)

    if checks.blocklist is not None and not checks.blocklist.empty:
        blocked, stats.no_url = checks.blocklist.match_batch(one_array(table.column("meta")))
        for index, (url, entry) in blocked.items():
            stats.blocked[entry.split(":", 1)[0]] += 1
            reasons[index], details[index] = "blocked_url", f"{url} is on blocklist {entry}"

    if checks.benchmarks is not None:
        found = _contamination(column, checks.benchmarks, batch, sorted(findings.spans) if findings else [])
        stats.contaminated_ngrams.update(found.ngrams)
        cut: dict[int, str] = {}
        for index, detail in found.detail.items():
            if reasons[index] == "blocked_url":
                continue
            stats.contaminated.update(found.benchmarks[index])
            if config.decontamination.mode == "remove":
                text, spans = remove_spans(column[index].as_py(), checks.benchmarks)
                if spans and text.strip():
                    cut[index] = text
                    stats.spans_removed += spans
                    continue
                detail += " (nothing left once the matching spans are removed)" if spans else ""
            reasons[index], details[index] = "contaminated", detail
        if cut:
            stats.documents_cut += len([i for i in cut if reasons[i] is None])
            column = _replaced(column, cut)

    if column is not original:
        table = table.set_column(table.schema.get_field_index("text"), "text", column)
    keep = pa.array([r is None for r in reasons], pa.bool_())
    if findings is not None:
        stats.redacted_documents = sum(1 for i in findings.spans if reasons[i] is None)
    dropped = [i for i, r in enumerate(reasons) if r is not None]
    quarantined = with_quarantine_reason(
        table.take(pa.array(dropped, pa.int64())), STAGE, [reasons[i] for i in dropped]
    ).append_column("detail", pa.array([details[i] for i in dropped], pa.string()))
    return table.filter(keep), quarantined, stats
