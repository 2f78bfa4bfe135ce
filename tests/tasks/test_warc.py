"""WARC and HTML sources: metadata kept, each quarantine reason, partitions at record boundaries
(plain and gzip), the HTML format, and files from another writer (warcio). Every WARC file is made
here (flows.demo_web writes records by hand; warcio's writer for the cross-check)."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from flows.demo_web import bad_records, make_pages, warc_record, write_warc
from tasks.ingest import IngestConfig, SourceConfig, ingest_partition, plan_partitions
from tasks.ingest.warc_boundaries import record_boundaries


def _source(path: Path, fmt: str = "warc", **kwargs) -> SourceConfig:
    return SourceConfig(name="web", kind="prose", format=fmt, path=str(path), **kwargs)


def _ingest(source: SourceConfig, config: IngestConfig | None = None) -> tuple[pa.Table, pa.Table, int]:
    config = config or IngestConfig(sources=[source])
    partitions = plan_partitions(source, config)
    tables = [ingest_partition(source, p, config) for p in partitions]
    return pa.concat_tables([t[0] for t in tables]), pa.concat_tables([t[1] for t in tables]), len(partitions)


def _metas(table: pa.Table) -> list[dict]:
    return [json.loads(m) for m in table.column("meta").to_pylist()]


@pytest.mark.parametrize("name", ["crawl.warc", "crawl.warc.gz"])
def test_response_records_become_documents_with_their_metadata(tmp_path: Path, name: str) -> None:
    pages = make_pages(4)
    records = []
    for page in pages:
        records += [
            warc_record(page.url, b"", record_type="request"),
            warc_record(page.url, page.html.encode()),
        ]
    records.append(warc_record("https://ex.org/robots.txt", b"User-agent: *\nDisallow:\n", "text/plain"))
    write_warc(tmp_path / "w" / name, records)
    kept, quarantined, _ = _ingest(_source(tmp_path / "w"))
    assert quarantined.num_rows == 0, quarantined.to_pylist()
    assert kept.num_rows == 5, "request records are not documents; the plain-text response is"
    metas = _metas(kept)
    assert [m["url"] for m in metas] == [p.url for p in pages] + ["https://ex.org/robots.txt"]
    assert all(m["warc_record_id"].startswith("<urn:uuid:") for m in metas)
    assert {m["date"] for m in metas} == {"2024-05-01T12:00:00Z"}
    assert [m["content_type"] for m in metas] == ["text/html"] * 4 + ["text/plain"]
    assert [m["charset"] for m in metas] == ["utf-8"] * 4 + [None]
    assert all(m["format"] == "warc" and m["kind"] == "prose" for m in metas)
    # locators count the file's records from 1: responses are the even ones
    assert kept.column("locator").to_pylist() == [f"{name}:{n}" for n in (2, 4, 6, 8, 9)]
    texts = kept.column("text").to_pylist()
    for page, text in zip(pages, texts, strict=False):
        assert all(line in text for line in page.main_lines)
        assert "<p>" not in text and "Accept all cookies" not in text and "Privacy policy" not in text
    assert texts[-1] == "User-agent: *\nDisallow:\n"


def test_each_bad_record_is_quarantined_with_its_reason_and_detail(tmp_path: Path) -> None:
    bad = bad_records(oversized_bytes=20_000)
    bad["bad_charset_unknown"] = warc_record(
        "https://ex.org/k.html", b"<p>x</p>", "text/html; charset=x-klingon"
    )
    good = make_pages(1)[0]
    cut = warc_record(good.url + "?cut", good.html.encode())
    write_warc(
        tmp_path / "w" / "bad.warc",
        [warc_record(good.url, good.html.encode()), *bad.values(), cut[: len(cut) // 2]],
    )
    kept, quarantined, _ = _ingest(_source(tmp_path / "w"), IngestConfig(max_doc_bytes=16_000))
    assert kept.num_rows == 1
    rows = quarantined.to_pylist()
    reasons = Counter(r["reason"] for r in rows)
    assert reasons == {
        "not_html": 1,
        "bad_charset": 2,
        "empty_extraction": 1,
        "oversized_page": 1,
        "http_status": 1,
        "truncated_record": 2,
    }
    detail = {(r["reason"], json.loads(r["meta"])["url"].rsplit("/", 1)[-1]): r["detail"] for r in rows}
    assert detail["not_html", "logo.png"] == "content type image/png"
    assert detail["bad_charset", "latin.html"].startswith("invalid utf-8 at byte ")
    assert detail["bad_charset", "k.html"] == "unknown charset 'x-klingon' declared"
    assert "no main text" in detail["empty_extraction", "empty.html"]
    assert "> max_doc_bytes 16000" in detail["oversized_page", "huge.html"]
    assert detail["http_status", "moved.html"].startswith("HTTP status 301")
    assert "WARC-Truncated" in detail["truncated_record", "cut.html"]
    assert "before the file ends" in detail["truncated_record", good.url.rsplit("/", 1)[-1] + "?cut"]
    assert all(r["stage"] == "ingest" and json.loads(r["meta"])["warc_record_id"] for r in rows)


def test_a_file_that_is_not_warc_is_one_malformed_record_and_earlier_records_are_kept(tmp_path: Path) -> None:
    page = make_pages(1)[0]
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "junk.warc").write_bytes(b"this is not a WARC file\n" * 10)
    (tmp_path / "w" / "tail.warc").write_bytes(warc_record(page.url, page.html.encode()) + b"garbage\r\n\r\n")
    kept, quarantined, _ = _ingest(_source(tmp_path / "w"))
    assert kept.column("locator").to_pylist() == ["tail.warc:1"]
    assert [(r["locator"], r["reason"]) for r in quarantined.to_pylist()] == [
        ("junk.warc:1", "malformed_warc"),
        ("tail.warc:2", "malformed_warc"),
    ]
    assert "not readable as WARC" in quarantined.column("detail")[0].as_py()


@pytest.mark.parametrize("name", ["big.warc", "big.warc.gz"])
def test_partitions_start_at_record_boundaries_and_cover_every_record_once(tmp_path: Path, name: str) -> None:
    pages = make_pages(40, seed=3)
    records = []
    for page in pages:
        records += [
            warc_record(page.url, b"", record_type="request"),
            warc_record(page.url, page.html.encode()),
        ]
    path = write_warc(tmp_path / "w" / name, records)
    source = _source(tmp_path / "w")
    config = IngestConfig(sources=[source], partition_bytes=path.stat().st_size // 7)
    partitions = plan_partitions(source, config)
    assert 6 <= len(partitions) <= 8, "the file is spread over partitions of about partition_bytes"
    boundaries = dict(record_boundaries(str(path)))
    assert len(boundaries) == len(records), "every record of a file written a member per record is a boundary"
    assert partitions[0].start == 0 and partitions[-1].end == -1
    for before, after in zip(partitions, partitions[1:], strict=False):
        assert before.end == after.start and boundaries[after.start] == after.first_line
    kept, quarantined, _ = _ingest(source, config)
    assert quarantined.num_rows == 0
    assert [json.loads(m)["url"] for m in kept.column("meta").to_pylist()] == [p.url for p in pages]
    assert kept.column("locator").to_pylist() == [f"{name}:{2 * i + 2}" for i in range(len(pages))]
    assert len(set(kept.column("id").to_pylist())) == len(pages)


@pytest.mark.parametrize("members", ["one stream", "two records a member"])
def test_a_gzip_warc_without_a_member_per_record_is_not_cut_inside_a_member(
    tmp_path: Path, members: str
) -> None:
    pages = make_pages(12, seed=5)
    records = [warc_record(p.url, p.html.encode()) for p in pages]
    path = tmp_path / "w" / "crawl.warc.gz"
    path.parent.mkdir()
    if members == "one stream":
        path.write_bytes(gzip.compress(b"".join(records), mtime=0))
    else:
        path.write_bytes(
            b"".join(gzip.compress(a + b, mtime=0) for a, b in zip(records[::2], records[1::2], strict=True))
        )
    source = _source(path.parent)
    config = IngestConfig(sources=[source], partition_bytes=path.stat().st_size // 4)
    partitions = plan_partitions(source, config)
    for partition in partitions:  # every cut is where a gzip member starts, a record at its head
        assert partition.start == 0 or path.read_bytes()[partition.start : partition.start + 2] == b"\x1f\x8b"
    kept, quarantined, _ = _ingest(source, config)
    assert quarantined.num_rows == 0
    assert [json.loads(m)["url"] for m in kept.column("meta").to_pylist()] == [p.url for p in pages]
    assert len(set(kept.column("locator").to_pylist())) == len(pages)


def test_files_from_warcio_are_read(tmp_path: Path) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    pages = make_pages(3, seed=7)
    path = tmp_path / "w" / "warcio.warc.gz"
    path.parent.mkdir()
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True)
        for page in pages:
            http = StatusAndHeaders(
                "200 OK", [("Content-Type", "text/html; charset=UTF-8")], protocol="HTTP/1.0"
            )
            record = writer.create_warc_record(
                page.url, "response", payload=io.BytesIO(page.html.encode()), http_headers=http
            )
            writer.write_record(record)
    kept, quarantined, _ = _ingest(_source(path.parent))
    assert quarantined.num_rows == 0
    metas = _metas(kept)
    assert [m["url"] for m in metas] == [p.url for p in pages]
    assert [m["charset"] for m in metas] == ["utf-8"] * 3
    assert all(pages[i].main_lines[1] in text for i, text in enumerate(kept.column("text").to_pylist()))


def test_html_files_one_page_each_with_the_canonical_url_or_none(tmp_path: Path) -> None:
    pages = make_pages(2, seed=9)
    root = tmp_path / "site"
    root.mkdir()
    (root / "a.html").write_text(pages[0].html, encoding="utf-8")
    without_link = pages[1].html.replace(f'<link rel="canonical" href="{pages[1].url}">', "")
    (root / "b.html").write_bytes(
        without_link.replace(
            '<meta charset="utf-8">',
            '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">',
        )
        .replace("report", "caf\u00e9")
        .encode("cp1252")
    )
    (root / "c.html").write_text("<html><body><script>x()</script></body></html>")
    (root / "d.html").write_bytes(
        b"<html><head><meta charset=utf-8></head><body><p>\xff\xfe bad</p></body></html>"
    )
    kept, quarantined, _ = _ingest(_source(root, "html", include=["*.html"]))
    metas = _metas(kept)
    assert kept.column("locator").to_pylist() == ["a.html", "b.html"]
    assert metas[0]["url"] == pages[0].url and "url" not in metas[1]
    assert [m["charset"] for m in metas] == ["utf-8", "windows-1252"]
    assert "caf\u00e9" in kept.column("text")[1].as_py(), "decoded in the charset the page declares"
    assert {r["locator"]: r["reason"] for r in quarantined.to_pylist()} == {
        "c.html": "empty_extraction",
        "d.html": "bad_charset",
    }


def test_id_field_is_refused_for_web_formats() -> None:
    with pytest.raises(ValidationError, match="id_field applies to jsonl and parquet sources"):
        SourceConfig(name="w", kind="prose", format="warc", path=".", id_field="x")


WEB_CONFIG = """
[ingest]
max_doc_bytes = 262144
partition_bytes = 65536

[[ingest.sources]]
name = "crawl"
kind = "prose"
format = "warc"
path = "web/warc"

[[ingest.sources]]
name = "pages"
kind = "prose"
format = "html"
path = "web/html"
include = ["*.html"]

[shards]
vocab_size = 300
seq_len = 64

[gates]
min_documents = 10

[repository]
spec = "repo"
results = "results"
"""

WARC_REASONS = {
    "not_html",
    "bad_charset",
    "empty_extraction",
    "oversized_page",
    "http_status",
    "truncated_record",
}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_curate_publishes_a_version_from_a_warc_source_and_reports_its_reasons(tmp_path, capsys, monkeypatch):
    from flows.cli import main
    from flows.demo_web import write_web_sample
    from flows.funnel import funnel_of
    from tasks.stage import StageResult
    from versioning.local import LocalRepo

    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    write_web_sample(tmp_path / "web", pages=40)
    config = tmp_path / "web.toml"
    config.write_text(WEB_CONFIG)
    assert main(["curate", "--config", str(config), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["new"] and made["tag"].startswith("ds-")
    ingest_row = next(row for row in made["stages"] if row["stage"] == "ingest")
    shown = {part.split(": ")[0] for part in ingest_row["quarantined by reason"].split(", ")}
    assert shown == WARC_REASONS, "the run's table names each WARC reason"

    repo = LocalRepo(tmp_path / "repo")
    report = json.loads(repo.get(made["tag"], "reports/ingest.json"))
    crawl = report["per_source"]["crawl"]
    assert set(crawl["rejected"]) == WARC_REASONS and all(n == 1 for n in crawl["rejected"].values())
    assert crawl["kept"] == 40 and report["per_source"]["pages"]["kept"] == 10
    assert crawl["partitions"] > 2, "the WARC files were cut into byte ranges"
    funnel = funnel_of({"ingest": StageResult("ingest", made["commit_id"], report)})
    assert {label for label, _ in funnel.quarantined} == {f"ingest: {r}" for r in WARC_REASONS}
    validated = json.loads(repo.get(made["tag"], "reports/validate.json"))["per_source"]
    assert validated["crawl"]["kept"] > 0 and validated["pages"]["kept"] > 0
    assert made["stages"][-1]["stage"] == "mix" and all(
        json.loads(repo.get(made["tag"], "shards/manifest.json"))["sources"][s]["tokens"] > 0
        for s in ("crawl", "pages")
    )
