"""The run's stage tables stay narrow enough to read in the Prefect UI at 1600 px, and lose
nothing: the long text (every quarantine reason, what a stage produced, the run a reused
stage came from, the full commit) moves to a second table, one fact per row."""

from __future__ import annotations

from flows.artifacts import StageRun, SummaryLinks, compact_row, detail_rows, summary_markdown
from tasks.stage import StageResult
from tasks.stage_task import stage_table

# Prefect draws table cells at about 8 px a character with ~16 px of padding each: a row of at
# most 150 characters over 9 columns fits 1600 px beside the navigation bar
ROW_CHARS = 150
CELL_CHARS = 64

WEB_REASONS = {
    "not_html": 310,
    "truncated_record": 12,
    "bad_charset": 7,
    "empty_extraction": 2_400,
    "oversized_page": 3,
    "http_status": 980,
    "malformed_warc": 1,
}


def _web_run(reused: bool) -> list[StageRun]:
    ingest = StageResult(
        "ingest",
        "a" * 64,
        {
            "documents_in": 1_234_567,
            "kept": 1_230_854,
            "rejected": WEB_REASONS,
            "tokens": 0,
            "seconds": 1234.5,
            "per_source": {},
        },
        flow_run_id="1",
    )
    shard = StageResult(
        "shard",
        "b" * 64,
        {
            "documents_in": 1_230_854,
            "kept": 1_230_854,
            "rejected": {},
            "tokens": 987_654_321,
            "seconds": 55.0,
            "per_source": {},
            "extra": {"sequences": 482_253, "documents_in_shards": 1_230_854},
        },
    )
    return [StageRun(ingest, reused, computed_by="brave-tiger" if reused else ""), StageRun(shard)]


def _width(rows: list[dict[str, object]]) -> int:
    return sum(max(len(column), *(len(str(row.get(column) or "")) for row in rows)) for column in rows[0])


def test_the_stages_table_is_narrow_with_many_reasons_and_long_products():
    for reused in (False, True):
        rows = [compact_row(run) for run in _web_run(reused)]
        assert _width(rows) <= ROW_CHARS, rows
        assert all(len(str(cell)) <= CELL_CHARS for row in rows for cell in row.values()), rows
        assert rows[0]["top reasons"] == "empty_extraction: 2400, http_status: 980, not_html: 310, +4 more"
        assert rows[0]["ran"] == ("reused" if reused else "ran") and rows[1]["ran"] == "ran"
        assert rows[0]["commit"] == "a" * 12


def test_the_details_table_keeps_every_reason_the_product_and_the_reused_run():
    details = detail_rows(_web_run(reused=True))
    facts = {(row["stage"], row["detail"]): row["value"] for row in details}
    assert {reason: facts[("ingest", f"quarantined: {reason}")] for reason in WEB_REASONS} == WEB_REASONS
    assert facts[("ingest", "commit")] == "a" * 64
    assert "by run brave-tiger" in facts[("ingest", "ran")]
    assert facts[("shard", "produced")].startswith("987,654,321 tokens in 482,253 sequences")
    assert ("shard", "ran") not in facts, "a stage that ran has nothing to say about where it came from"
    assert set(details[0]) == {"stage", "detail", "value"}


def test_the_summary_table_uses_the_narrow_rows():
    published = type("Published", (), {"new": True, "tag": "ds-20261202-1", "commit_id": "c" * 64})()
    text = summary_markdown(published, "run-x", _web_run(reused=False), SummaryLinks(repository="r"))
    table = [line for line in text.splitlines() if line.startswith("| ingest")]
    assert len(table) == 1 and "+4 more" in table[0] and "malformed_warc" not in table[0]
    assert "curate-stage-details" in text


def test_a_stage_table_has_two_reason_columns_however_many_reasons():
    report = {
        "documents_in": 3_700,
        "kept": 0,
        "rejected": WEB_REASONS,
        "rejected_total": sum(WEB_REASONS.values()),
        "tokens": 0,
        "seconds": 12.0,
        "per_source": {"crawl": {"documents_in": 3_700, "kept": 0, "rejected": WEB_REASONS, "partitions": 4}},
    }
    rows = stage_table(report)
    assert _width(rows) <= ROW_CHARS, rows
    crawl, total = rows
    assert not [column for column in crawl if column.startswith("rejected_")]
    assert crawl["rejected"] == total["rejected"] == sum(WEB_REASONS.values())
    assert crawl["top reasons"].endswith("+4 more") and crawl["partitions"] == 4
