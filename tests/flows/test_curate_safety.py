"""Curate with the safety stage on: a benchmark set, PII redaction and a blocklist. The version
publishes, commits what it was checked against, its report and funnel show each new reason,
and the shards hold the redacted text, never the original."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from flows.curate import curate
from flows.funnel import funnel_of
from flows.params import CurateParams
from formats.layout import STAGES
from formats.shards import read_shard_bytes
from tasks.safety.decontaminate import filter_word_bits
from tasks.stage import StageResult
from tests.flows.curate_support import column, prose_document, stage_outcomes, write_corpus
from versioning import DataRepo
from versioning.local import LocalRepo

pytestmark = pytest.mark.usefixtures("prefect_harness")

QUESTION = (
    "What is the boiling point of liquid nitrogen measured at standard atmospheric pressure in degrees kelvin"
)
NEW_QUESTION = (
    "Name the composer who wrote the famous opera about a clever barber living in the old city of Seville"
)
EMAIL = "jane.doe@acme-corp.io"


def write_safety_corpus(root: Path) -> dict[str, Any]:
    """The curate corpus plus a JSONL web source with URLs, planted contamination and e-mail
    addresses, a benchmark file and a blocklist."""
    corpus: dict[str, Any] = write_corpus(root / "sources")
    rng = random.Random(5)
    lines = []
    for i in range(24):
        text = prose_document(rng)
        url = f"https://site{i}.example.org/page"
        if i < 3:
            url = f"https://www{i}.spam-farm.test/landing"  # blocked by domain
            text += "\nVisit our sponsor zorblax today.\n"
        elif i == 3:
            url = "https://news.example.org/private/leak"  # blocked by path prefix
            text += "\nVisit our sponsor zorblax today.\n"
        elif i in (4, 5):
            text += f"\n\nQuiz time. {QUESTION.upper()}?\n"  # contaminated
        elif i in (6, 7):
            text += f"\n\nMy old notes say: {NEW_QUESTION}.\n"  # contaminated by the later set only
        if i % 2 == 0:
            text += f"\nWrite to {EMAIL} for a copy.\n"
        lines.append(json.dumps({"text": text, "url": url}))
    web = root / "sources" / "web.jsonl"
    web.write_text("\n".join(lines) + "\n")
    corpus["web"] = web
    bench = root / "bench"
    bench.mkdir()
    (bench / "science.jsonl").write_text(
        json.dumps({"id": "sci-1", "question": QUESTION, "choices": ["77 K", "273 K"]}) + "\n"
        + json.dumps({"id": "sci-2", "question": "Which gas makes up most of the air we breathe", "choices": []})
        + "\n"
    )  # fmt: skip
    (bench / "opera.jsonl").write_text(json.dumps({"uid": "op-9", "prompt": NEW_QUESTION}) + "\n")
    (root / "blocked_domains.txt").write_text("# spam\nspam-farm.test\n")
    (root / "blocked_urls.txt").write_text("news.example.org/private\n")
    return corpus


def safety_params(root: Path, corpus: dict[str, Any]) -> CurateParams:
    return CurateParams.from_dict(
        {
            "ingest": {
                "sources": [
                    {"name": "prose", "kind": "prose", "format": "files", "path": str(corpus["prose"])},
                    {"name": "code", "kind": "code", "format": "files", "path": str(corpus["code"])},
                    {"name": "web", "kind": "prose", "format": "jsonl", "path": str(corpus["web"])},
                ]
            },
            "safety": {
                "decontamination": {
                    "benchmarks": [
                        {
                            "name": "science",
                            "path": str(root / "bench" / "science.jsonl"),
                            "fields": ["question", "choices"],
                            "id_field": "id",
                        }
                    ]
                },
                "pii": {"enabled": True},
                "blocklist": {
                    "lists": [
                        {"name": "spam", "path": str(root / "blocked_domains.txt"), "kind": "domains"},
                        {"name": "leaks", "path": str(root / "blocked_urls.txt"), "kind": "urls"},
                    ]
                },
            },
            "shards": {"vocab_size": 300, "seq_len": 64, "tokenizer_sample_mb": 1.0},
            "gates": {"min_documents": 10, "min_tokens": 1000},
            "repository": {"spec": str(root / "repo"), "results": str(root / "results")},
            "retry": {"retries": 3, "backoff_seconds": 0.05, "jitter_factor": 0.5},
        }
    )


def shard_text(repo: DataRepo, ref: str, source: str) -> str:
    """Every token a source's shards store, decoded with the version's tokenizer."""
    tokenizer = Tokenizer.from_str(repo.get(ref, "tokenizer/tokenizer.json").decode())
    rows = []
    for stat in sorted(repo.list(ref, f"shards/{source}/"), key=lambda s: s.path):
        _, sequences = read_shard_bytes(repo.get(ref, stat.path))
        rows.append(np.asarray(sequences).reshape(-1))
    return tokenizer.decode(np.concatenate(rows).tolist())


def results_of(repo: DataRepo, ref: str) -> dict[str, StageResult]:
    return {
        stage: StageResult(stage, "", json.loads(repo.get(ref, f"reports/{stage}.json"))) for stage in STAGES
    }


def test_curate_with_benchmarks_pii_and_blocklist_publishes_a_safe_version(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    corpus = write_safety_corpus(tmp_path)
    params = safety_params(tmp_path, corpus)
    with stage_outcomes() as outcomes:
        version = curate(params)
    assert outcomes == dict.fromkeys(STAGES, "ran") and version.new
    repo = LocalRepo(tmp_path / "repo")

    # what the version was checked against is committed with it
    assert (
        repo.get(version.tag, "eval_sets/science/science.jsonl")
        == (tmp_path / "bench" / "science.jsonl").read_bytes()
    )
    spec = json.loads(repo.get(version.tag, "eval_sets/science/spec.json"))
    assert (spec["ngram"], spec["items"], spec["fields"]) == (13, 2, ["question", "choices"])
    assert repo.get(version.tag, "blocklists/spam.txt") == (tmp_path / "blocked_domains.txt").read_bytes()
    assert repo.get(version.tag, "blocklists/leaks.txt") == (tmp_path / "blocked_urls.txt").read_bytes()

    # the report: each new reason, counts per benchmark, per PII type, per list, per source
    report = json.loads(repo.get(version.tag, "reports/safety.json"))
    web = report["per_source"]["web"]
    assert web["rejected"] == {"blocked_url": 4, "contaminated": 2}
    assert web["contaminated"] == {
        "science": {"documents": 2, "ngrams": web["contaminated"]["science"]["ngrams"]}
    }
    assert web["blocked"] == {"spam": 3, "leaks": 1}
    assert web["pii"]["email"]["found"] == 12 and web["redacted_documents"] == 9  # 12 minus 3 quarantined
    # 8 bytes per n-gram, 2**8 + 1 bucket starts (the fewest), a Bloom filter of 12 to 24 bits an n-gram
    distinct = report["extra"]["benchmarks"]["distinct_ngrams"]
    assert report["extra"]["benchmarks"][
        "memory_bytes"
    ] == 8 * distinct + 4 * 257 + 8 * 2 ** filter_word_bits(distinct)
    details = column(repo, version.tag, "quarantine/safety/web/", "detail")
    assert any("benchmark science item sci-1" in d for d in details)
    assert any("is on blocklist leaks: news.example.org/private" in d for d in details)
    assert not any(EMAIL in t for t in column(repo, version.tag, "quarantine/safety/", "text")), (
        "the quarantine keeps the reason, not the address"
    )

    # the funnel: the safety step and each new reason and type, per source
    funnel = funnel_of(results_of(repo, version.tag))
    assert "after safety checks" in [step for step, _ in funnel.documents]
    quarantined = dict(funnel.quarantined)
    assert quarantined["safety: blocked_url"] == {"web": 4}
    assert quarantined["safety: contaminated"] == {"web": 2}
    assert dict(funnel.safety)["email found"]["web"] == 12

    # the shards hold the redacted text, never the original
    text = shard_text(repo, version.tag, "web")
    assert "<EMAIL>" in text and EMAIL not in text and "acme-corp" not in text
    assert "nitrogen measured at standard" not in text.lower(), (
        "contaminated documents never reach the shards"
    )
    assert "zorblax" not in text, "blocked pages never reach the shards"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_web_safety_example_publishes_from_a_warc_source_and_shows_each_new_reason(
    tmp_path, capsys, monkeypatch
):
    """examples/web_safety.toml as the docs run it: a WARC crawl from flows.demo_web, a benchmark
    set, PII redaction and two blocklists, through `tokenlake curate`."""
    from flows.cli import main
    from flows.demo_web import BENCHMARK_QUESTION, write_web_sample

    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    written = write_web_sample(tmp_path / "demo-web")
    config = tmp_path / "web_safety.toml"
    text = (EXAMPLES / "web_safety.toml").read_text()
    text = text.replace('path = "../.tokenlake/demo-web/safety"', f'path = "{written["safety"]}"')
    text = text.replace('path = "web_safety/', f'path = "{EXAMPLES}/web_safety/')
    config.write_text(text + f'\n[repository]\nspec = "{tmp_path / "repo"}"\n')
    assert main(["curate", "--config", str(config), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["new"]
    row = next(r for r in made["stages"] if r["stage"] == "safety")
    assert row["quarantined by reason"] == "blocked_url: 3, contaminated: 2, secret: 1", "the run's table"

    repo = LocalRepo(tmp_path / "repo")
    crawl = json.loads(repo.get(made["tag"], "reports/safety.json"))["per_source"]["crawl"]
    assert crawl["rejected"] == {"blocked_url": 3, "contaminated": 2, "secret": 1}
    assert (
        crawl["blocked"] == {"spam": 2, "private": 1}
        and crawl["contaminated"]["science-qa"]["documents"] == 2
    )
    assert {k: v["found"] for k, v in crawl["pii"].items()} == {"email": 3, "phone": 3, "aws_key": 1}
    assert crawl["redacted_documents"] == 3

    funnel = funnel_of(results_of(repo, made["tag"]))
    assert {"safety: blocked_url", "safety: contaminated", "safety: secret"} <= dict(
        funnel.quarantined
    ).keys()
    assert {"email found", "phone found", "aws_key found"} <= dict(funnel.safety).keys()
    shards = shard_text(repo, made["tag"], "crawl")
    assert "<EMAIL>" in shards and "<PHONE>" in shards and "harbor-courier" not in shards
    assert BENCHMARK_QUESTION.lower()[:40] not in shards.lower() and "AKIA4QZ7" not in shards
