"""URL blocklists: domain lists match a host and its subdomains, URL lists a host and a path
prefix at a segment boundary; blocked documents are quarantined as blocked_url with the list
and entry; documents without a URL pass; JSONL and Parquet sources carry the URL into meta."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.ingest import IngestConfig, SourceConfig
from tasks.ingest.stage import run_ingest
from tasks.parts import read_parts
from tasks.safety.blocklist import Blocklist, BlocklistError
from tasks.safety.config import BlocklistConfig, BlocklistFile, SafetyConfig
from tasks.safety.screen import SafetyChecks, apply_safety
from tasks.schema import DOCUMENT_SCHEMA
from versioning.local import LocalRepo


@pytest.fixture
def blocklist(tmp_path) -> Blocklist:
    (tmp_path / "domains.txt").write_text(
        "# spam farms\nspam.example\n0.0.0.0 ads.tracker.net\n*.casino.biz\n\n"
    )
    (tmp_path / "urls.txt").write_text("news.example.org/private\nhttps://www.forum.example.net/u/\n")
    return Blocklist.load(
        BlocklistConfig(
            lists=[
                BlocklistFile(name="spam", path=str(tmp_path / "domains.txt"), kind="domains"),
                BlocklistFile(name="paths", path=str(tmp_path / "urls.txt"), kind="urls"),
            ]
        )
    )


@pytest.mark.parametrize(
    ("url", "entry"),
    [
        ("https://spam.example/page", "spam: spam.example"),
        ("http://a.b.spam.example:8080/x?y=1", "spam: spam.example"),
        ("https://WWW.Spam.Example./", "spam: spam.example"),
        ("https://ads.tracker.net/pixel.gif", "spam: ads.tracker.net"),
        ("https://eu.casino.biz/", "spam: casino.biz"),
        ("https://news.example.org/private", "paths: news.example.org/private"),
        ("https://news.example.org/private/2024/story.html", "paths: news.example.org/private"),
        ("http://forum.example.net/u/alice", "paths: forum.example.net/u"),
        ("news.example.org/private/x", "paths: news.example.org/private"),
    ],
)
def test_blocked(blocklist, url, entry):
    assert blocklist.match(url) == entry


@pytest.mark.parametrize(
    "url",
    [
        "https://notspam.example/",  # a suffix of the name, not a subdomain
        "https://example/",
        "https://tracker.net/",  # the parent of a listed subdomain
        "https://news.example.org/privateer",  # a prefix of a path segment, not the segment
        "https://news.example.org/public/private",
        "https://sub.news.example.org/private",  # URL entries name one host
        "https://forum.example.net/users",
    ],
)
def test_not_blocked(blocklist, url):
    assert blocklist.match(url) is None


def docs(metas: list[str]) -> pa.Table:
    n = len(metas)
    return pa.table(
        [
            pa.array([f"id{i}" for i in range(n)]),
            pa.array(["web"] * n),
            pa.array([f"text {i}" for i in range(n)]),
            pa.array([f"doc-{i}" for i in range(n)]),
            pa.array(metas),
        ],
        schema=DOCUMENT_SCHEMA,
    )


def test_blocked_documents_are_quarantined_with_list_and_entry(blocklist):
    config = SafetyConfig(
        blocklist=BlocklistConfig(lists=[BlocklistFile(name="spam", path="-", kind="domains")])
    )
    metas = [
        json.dumps({"url": "https://x.spam.example/a"}),
        json.dumps({"url": "https://good.example/a"}),
        json.dumps({"kind": "prose"}),  # no URL: not checked
        "not json",
    ]
    kept, quarantined, stats = apply_safety(docs(metas), SafetyChecks(config, blocklist=blocklist))
    assert kept.column("id").to_pylist() == ["id1", "id2", "id3"]
    assert quarantined.column("reason").to_pylist() == ["blocked_url"]
    assert (
        quarantined.column("detail")[0].as_py()
        == "https://x.spam.example/a is on blocklist spam: spam.example"
    )
    assert stats.blocked == {"spam": 1} and stats.no_url == 2


def test_a_batch_is_matched_as_each_url_is_alone(blocklist, tmp_path):
    (tmp_path / "wide.txt").write_text("example.org\n")
    (tmp_path / "narrow.txt").write_text("deep.example.org\n")
    (tmp_path / "paths.txt").write_text("deep.example.org/private\n")
    nested = Blocklist.load(
        BlocklistConfig(
            lists=[
                BlocklistFile(name="wide", path=str(tmp_path / "wide.txt"), kind="domains"),
                BlocklistFile(name="narrow", path=str(tmp_path / "narrow.txt"), kind="domains"),
                BlocklistFile(name="paths", path=str(tmp_path / "paths.txt"), kind="urls"),
            ]
        )
    )
    urls = [
        "https://spam.example/page",
        "http://a.b.spam.example:8080/x?y=1",
        "https://WWW.Spam.Example./",
        "https://eu.casino.biz/",
        "https://news.example.org/private/2024/story.html",
        "https://news.example.org/privateer",
        "https://notspam.example/",
        "https://a.deep.example.org/private",  # the longest listed parent wins
        "https://deep.example.org/private/x",
        "https://other.example.org/",
        "https://user@spam.example/",  # read in Python
        "https://[::1]/",
        "",
    ]
    metas = pa.array([json.dumps({"url": url}) for url in urls] + ['{"kind": "prose"}'])
    for listed in (blocklist, nested):
        blocked, no_url = listed.match_batch(metas)
        expected = {i: (url, listed.match(url)) for i, url in enumerate(urls) if url and listed.match(url)}
        assert blocked == expected
        assert no_url == 2


def test_a_missing_list_file_fails_with_one_sentence(tmp_path):
    config = BlocklistConfig(
        lists=[BlocklistFile(name="gone", path=str(tmp_path / "gone.txt"), kind="domains")]
    )
    with pytest.raises(BlocklistError, match="blocklist file .*gone.txt does not exist"):
        Blocklist.load(config)


def test_jsonl_and_parquet_sources_keep_their_url_in_meta(tmp_path):
    (tmp_path / "web.jsonl").write_text(
        json.dumps({"text": "a page about rivers", "url": "https://spam.example/r"})
        + "\n"
        + json.dumps({"text": "a page without a url"})
        + "\n"
    )
    pq.write_table(
        pa.table({"body": ["a parquet page"], "link": ["https://good.example/p"]}), tmp_path / "p.parquet"
    )
    config = IngestConfig(
        sources=[
            SourceConfig(name="web", kind="prose", format="jsonl", path=str(tmp_path / "web.jsonl")),
            SourceConfig(
                name="pq",
                kind="prose",
                format="parquet",
                path=str(tmp_path / "p.parquet"),
                text_field="body",
                url_field="link",
            ),
        ]
    )
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    run_ingest(repo, "main", "", config)
    metas = {
        row["text"]: json.loads(row["meta"])
        for table in read_parts(repo, "main", "raw/")
        for row in table.to_pylist()
    }
    assert metas["a page about rivers"]["url"] == "https://spam.example/r"
    assert "url" not in metas["a page without a url"]
    assert metas["a parquet page"]["url"] == "https://good.example/p"
