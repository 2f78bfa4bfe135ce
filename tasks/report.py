"""What every stage counts and reports: documents in, kept and rejected by reason, balanced.

Its own module below :mod:`tasks.stage` and :mod:`tasks.gates`, which both use it (a gate
writes its verdict into the stage's report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class DocumentCounts:
    """Documents in, kept, and rejected by reason: what every stage counts, per source and in
    total, and balances (documents in == kept + rejected: nothing is lost silently)."""

    documents_in: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reject(self, reason: str, count: int = 1) -> None:
        if count:
            self.rejected[reason] = self.rejected.get(reason, 0) + count

    def add(self, other: DocumentCounts) -> None:
        self.documents_in += other.documents_in
        self.kept += other.kept
        for reason, count in other.rejected.items():
            self.reject(reason, count)

    def check_balance(self, what: str) -> None:
        if self.documents_in != self.kept + self.rejected_total:
            raise AssertionError(
                f"{what}: documents in ({self.documents_in}) != kept ({self.kept}) "
                f"+ rejected ({self.rejected_total}); documents were lost"
            )


@dataclass
class StageReport(DocumentCounts):
    """What a stage did, written to ``reports/<stage>.json``; its counts must balance."""

    stage: str = field(kw_only=True)
    tokens: int = 0
    seconds: float = 0.0
    note: str = ""  # what else the stage did, in a few words (its log line)
    per_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    expectations: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # what the stage commit carries besides the common fields (gate verdict, sha256s, ...);
    # not part of reports/<stage>.json
    commit_metadata: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        report = asdict(self) | {"rejected_total": self.rejected_total}
        del report["commit_metadata"]
        return report
