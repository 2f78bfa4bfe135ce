"""The safety checks as one pure function over an Arrow batch: blocked URLs, benchmark
contamination, personal data and secrets.

The blocklists come first (they read the metas only); redaction applies to every document,
kept or quarantined, so no copy of a found secret is written anywhere (the quarantine keeps the
reason and the redacted text).
Then each document gets at most one reason, in this order: ``blocked_url``, ``contaminated``,
``secret`` (a credential type in quarantine mode), ``pii`` (a personal type in quarantine mode).
A blocked document is quarantined whatever else it holds, so it is not checked against the
benchmarks (the report's contamination counts leave it out; about a tenth of the work on the
benchmark's corpus).
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
from tasks.safety.pii import Findings, find_pii, redact_texts
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
    texts: pa.Array, findings: Findings, benchmarks: BenchmarkSet, batch: BatchBytes, blocked: np.ndarray
) -> Contamination:
    """``find_contamination`` of the texts as redacted, but the ``blocked`` ones (quarantined
    already): ``batch`` (the bytes before redaction) for the texts PII left alone, the redacted
    texts' own bytes for the others."""
    redacted = [i for i in sorted(findings.spans) if not blocked[i]]
    skip = blocked.copy()
    skip[redacted] = True
    found = find_contamination(texts, benchmarks, batch, skip)
    if not redacted:
        return found
    changed = find_contamination(redact_texts(texts, findings, batch, np.array(redacted)), benchmarks)
    for local, index in enumerate(redacted):
        if local in changed.detail:
            found.detail[index] = changed.detail[local]
            found.benchmarks[index] = changed.benchmarks[local]
    found.ngrams.update(changed.ngrams)
    return found


def _rows(
    table: pa.Table, texts: pa.Array, findings: Findings, batch: BatchBytes | None, rows: list[int], cut: dict
) -> pa.Table:
    """The rows of ``table`` at ``rows`` (ascending), their texts redacted, or cut where ``cut``
    has them (one copy of their bytes: redaction and selection together). Rows are chosen by a
    filter, as a take would first combine each column's chunks."""
    chosen = None
    if len(rows) < len(texts):
        mask = np.zeros(len(texts), np.bool_)
        mask[rows] = True
        chosen = pa.array(mask)
    at, field = table.schema.get_field_index("text"), table.schema.field("text")
    if any(row in findings.spans for row in rows):
        column = redact_texts(texts, findings, batch, None if chosen is None else np.array(rows, np.int64))
        others = table.remove_column(at)
        if chosen is not None:
            others = others.filter(chosen)
        table = others.add_column(at, field, column)
    elif chosen is not None:
        table = table.filter(chosen)
    replaced = {k: cut[row] for k, row in enumerate(rows) if row in cut}
    if replaced:
        table = table.set_column(at, field, _replaced(one_array(table.column(at)), replaced))
    return table


def apply_safety(table: pa.Table, checks: SafetyChecks) -> tuple[pa.Table, pa.Table, SafetyStats]:
    """``(kept, quarantined, stats)`` of a batch; the quarantined table adds ``stage``,
    ``reason`` and ``detail``."""
    config, stats = checks.config, SafetyStats()
    n = table.num_rows
    reasons: list[str | None] = [None] * n
    details: list[str] = [""] * n
    texts = one_array(table.column("text"))

    if checks.blocklist is not None and not checks.blocklist.empty:
        blocked, stats.no_url = checks.blocklist.match_batch(one_array(table.column("meta")))
        for index, (url, entry) in blocked.items():
            stats.blocked[entry.split(":", 1)[0]] += 1
            reasons[index], details[index] = "blocked_url", f"{url} is on blocklist {entry}"

    modes = config.pii.active()
    reads_bytes = bool(modes) or checks.benchmarks is not None  # a blocklist alone reads metas only
    batch = batch_bytes(texts) if reads_bytes else None  # the bitmaps both PII and decontamination read
    findings = find_pii(texts, config.pii, batch) if modes else Findings({}, Counter())
    stats.pii_found.update(findings.counts)
    for index, spans in findings.spans.items():
        kinds = Counter(kind for _, _, kind in spans)
        stats.pii_documents.update(kinds.keys())
        held = sorted(k for k in kinds if modes[k] == "quarantine")
        if held and reasons[index] is None:
            reasons[index] = "secret" if any(k in SECRET_TYPES for k in held) else "pii"
            found = ", ".join(f"{k} x{c}" for k, c in sorted(kinds.items()))
            details[index] = f"found {found}; quarantined for {', '.join(held)}; the text here is redacted"

    cut: dict[int, str] = {}
    if checks.benchmarks is not None and batch is not None:
        blocked = np.array([r == "blocked_url" for r in reasons], np.bool_)
        found = _contamination(texts, findings, checks.benchmarks, batch, blocked)
        stats.contaminated_ngrams.update(found.ngrams)
        for index, detail in found.detail.items():
            stats.contaminated.update(found.benchmarks[index])
            if config.decontamination.mode == "remove":
                text = redact_texts(texts, findings, batch, np.array([index]))[0].as_py()
                text, spans = remove_spans(text, checks.benchmarks)
                if spans and text.strip():
                    cut[index] = text
                    stats.spans_removed += spans
                    continue
                detail += " (nothing left once the matching spans are removed)" if spans else ""
            reasons[index], details[index] = "contaminated", detail
        stats.documents_cut = len([i for i in cut if reasons[i] is None])

    stats.redacted_documents = sum(1 for i in findings.spans if reasons[i] is None)
    kept = [i for i, r in enumerate(reasons) if r is None]
    dropped = [i for i, r in enumerate(reasons) if r is not None]
    quarantined = with_quarantine_reason(
        _rows(table, texts, findings, batch, dropped, cut), STAGE, [reasons[i] for i in dropped]
    ).append_column("detail", pa.array([details[i] for i in dropped], pa.string()))
    return _rows(table, texts, findings, batch, kept, cut), quarantined, stats
