"""The curate funnel: per source, the documents each stage kept, those it quarantined by reason,
the occurrences of each PII and secret type the safety stage found, and the tokens the shards
and the mix hold, drawn as one PNG (an image artifact, and a file under ``<data home>/reports/``).

Read from the stage reports only (``reports/<stage>.json``, as the stage results carry them),
so a reused stage draws the same bars as the run that computed it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from tasks.stage import StageResult

DOCUMENT_STEPS = (  # (label, stage, report field per source)
    ("ingested", "ingest", "documents_in"),
    ("parsed", "ingest", "kept"),
    ("passed validation", "validate", "kept"),
    ("after dedup", "dedup", "kept"),
    ("after safety checks", "safety", "kept"),
    ("ending in shards", "shard", "documents_in_shards"),
)
TOKEN_STEPS = (
    ("stored in shards", "shard", "stored_tokens"),
    ("planned by the mix", "mix", "token_budget"),
)
INLINE_LIMIT = 512 << 10  # a larger PNG is linked as a file instead of inlined in the artifact


def funnel_path(tag: str) -> Path:
    """Where a version's funnel is drawn: ``<data home>/reports/<tag>/funnel.png``."""
    from versioning import data_home

    return data_home() / "reports" / tag / "funnel.png"


SAFETY_STAGE = "safety"


@dataclass(frozen=True)
class Funnel:
    sources: list[str]
    documents: list[tuple[str, dict[str, int]]]  # (step, {source: documents})
    tokens: list[tuple[str, dict[str, int]]]  # (step, {source: tokens})
    quarantined: list[tuple[str, dict[str, int]]] = field(
        default_factory=list
    )  # ("stage: reason", {source: n})
    safety: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # (what, {source: count})


def safety_rows(results: dict[str, StageResult]) -> list[tuple[str, dict[str, int]]]:
    """``<type> found`` rows (PII and secrets, redacted or not) and the contaminated spans the
    safety stage cut, per source; what it quarantined is in ``quarantined_by_reason``."""
    if SAFETY_STAGE not in results:
        return []
    per_source = results[SAFETY_STAGE].report.get("per_source") or {}
    rows: dict[str, dict[str, int]] = {}
    for source, stats in per_source.items():
        for kind, counts in (stats.get("pii") or {}).items():
            rows.setdefault(f"{kind} found", {})[source] = int(counts.get("found", 0))
        if stats.get("documents_cut"):
            rows.setdefault("contaminated spans cut", {})[source] = int(stats.get("spans_removed", 0))
    return list(rows.items())


def funnel_of(results: dict[str, StageResult]) -> Funnel:
    """The funnel's numbers from the stage reports (a step whose stage did not run is left out)."""

    def steps(spec: tuple[tuple[str, str, str], ...]) -> list[tuple[str, dict[str, int]]]:
        rows = []
        for label, stage, key in spec:
            if stage not in results:
                continue
            per_source = results[stage].report.get("per_source") or {}
            rows.append((label, {s: int(stats.get(key, 0) or 0) for s, stats in per_source.items()}))
        return rows

    documents, tokens, safety = steps(DOCUMENT_STEPS), steps(TOKEN_STEPS), safety_rows(results)
    sources = sorted({s for _, counts in documents + tokens for s in counts})
    return Funnel(sources, documents, tokens, quarantined_by_reason(results), safety)


def quarantined_by_reason(results: dict[str, StageResult]) -> list[tuple[str, dict[str, int]]]:
    """``("stage: reason", {source: documents})`` of every stage's quarantine, in stage order."""
    rows = []
    for stage, result in results.items():
        by_reason: dict[str, dict[str, int]] = {}
        for source, stats in (result.report.get("per_source") or {}).items():
            for reason, count in (stats.get("rejected") or {}).items():
                if count:
                    by_reason.setdefault(reason, {})[source] = int(count)
        rows += [(f"{stage}: {reason}", by_reason[reason]) for reason in sorted(by_reason)]
    return rows


def draw_funnel(funnel: Funnel, path: Path, title: str) -> Path:
    """Two centred, stacked bar funnels (documents, tokens), one colour per source, and the
    safety stage's counts below them when it found anything, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    panels = [(funnel.documents, "documents"), (funnel.tokens, "tokens")]
    if funnel.quarantined:
        panels.append((funnel.quarantined, "documents quarantined by reason"))
    if funnel.safety:
        panels.append((funnel.safety, "occurrences found (PII, secrets) or cut (contaminated spans)"))
    heights = [max(len(rows), 1) for rows, _ in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(9, 1.2 + 0.55 * sum(heights)),
        gridspec_kw={"height_ratios": heights},
        constrained_layout=True,
    )
    for ax, (rows, unit) in zip(axes, panels, strict=True):
        labels = [label for label, _ in rows]
        for y, (_, counts) in enumerate(rows):
            total = sum(counts.values())
            left = -total / 2
            for i, source in enumerate(funnel.sources):
                width = counts.get(source, 0)
                ax.barh(y, width, left=left, color=colours(i % 10), edgecolor="white",
                        label=source if y == 0 else None)  # fmt: skip
                left += width
            ax.text(total / 2, y, f"  {total:,}", va="center", ha="left", fontsize=9)
        ax.set_yticks(range(len(rows)), labels)
        ax.invert_yaxis()
        ax.set_xticks([])
        ax.set_title(f"{unit} per source", loc="left", fontsize=10)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        widest = max((sum(c.values()) for _, c in rows), default=1) or 1
        ax.set_xlim(-widest * 0.55, widest * 0.75)
    axes[0].legend(loc="lower right", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def image_url(path: Path) -> str:
    """A data URL the Prefect UI shows inline (small images), else the file's URL."""
    data = path.read_bytes()
    if len(data) <= INLINE_LIMIT:
        return "data:image/png;base64," + base64.b64encode(data).decode()
    return path.resolve().as_uri()
