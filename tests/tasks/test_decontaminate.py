"""Benchmark decontamination: planted contamination (exact, case and whitespace changed, inside a
long document), a near miss, precision and recall on a generated corpus, the remove-span mode,
the stage on a real local repository, and `tokenlake decontaminate` on a published version."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tasks.safety.blocklist import Blocklist
from tasks.safety.config import (
    BenchmarkConfig,
    BlocklistConfig,
    BlocklistFile,
    DecontaminationConfig,
    SafetyConfig,
)
from tasks.safety.decontaminate import BenchmarkError, BenchmarkSet
from tasks.safety.scan import may_hold, ngram_hashes
from tasks.safety.screen import SafetyChecks, apply_safety
from tasks.safety.words import LOWER_WORD, PY_WORD, batch_bytes, string_hashes
from tasks.text_bytes import mix64
from tests.tasks.safety_support import documents

VOCABULARY = [f"tok{i}" for i in range(5_000)]


def words(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(VOCABULARY) for _ in range(count)]


def write_benchmark(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def checks_for(tmp_path: Path, items: list[dict], mode: str = "quarantine", ngram: int = 13) -> SafetyChecks:
    bench = write_benchmark(tmp_path / "qa.jsonl", items)
    config = SafetyConfig(
        decontamination=DecontaminationConfig(
            benchmarks=[
                BenchmarkConfig(name="qa", path=str(bench), fields=["question", "choices"], id_field="id")
            ],
            ngram=ngram,
            mode=mode,
        )
    )
    return SafetyChecks(config, BenchmarkSet.build(config.decontamination))


QUESTION = (
    "Which of the following best describes the role of mitochondria in a eukaryotic cell during respiration"
)
ITEM = {"id": "bio-17", "question": QUESTION, "choices": ["energy production", "protein folding"]}


def test_planted_contamination_exact_case_whitespace_and_inside_a_long_document(tmp_path):
    rng = random.Random(0)
    checks = checks_for(tmp_path, [ITEM, {"id": "x-1", "question": " ".join(words(rng, 30)), "choices": []}])
    shouty = "  WHICH of THE following\n\nbest   describes the ROLE of mitochondria, in a eukaryotic cell!!"
    long_doc = " ".join(words(rng, 5_000)) + f" {QUESTION.upper()} " + " ".join(words(rng, 5_000))
    clean = " ".join(words(rng, 400))
    kept, quarantined, stats = apply_safety(documents([QUESTION, shouty, long_doc, clean]), checks)

    assert kept.column("id").to_pylist() == ["id3"]
    assert quarantined.column("id").to_pylist() == ["id0", "id1", "id2"]
    assert set(quarantined.column("reason").to_pylist()) == {"contaminated"}
    detail = quarantined.column("detail")[1].as_py()
    assert "benchmark qa" in detail and "item bio-17" in detail and "13-gram" in detail
    assert "'which of the following best describes the role of mitochondria in a eukaryotic'" in detail
    assert stats.contaminated == {"qa": 3}


def test_a_blocked_document_is_quarantined_as_blocked_and_not_counted_as_contaminated(tmp_path):
    (tmp_path / "domains.txt").write_text("spam.example\n")
    blocklist = BlocklistConfig(
        lists=[BlocklistFile(name="spam", path=str(tmp_path / "domains.txt"), kind="domains")]
    )
    checks = checks_for(tmp_path, [ITEM])
    checks = SafetyChecks(
        checks.config.model_copy(update={"blocklist": blocklist}),
        checks.benchmarks,
        Blocklist.load(blocklist),
    )
    batch = documents([QUESTION, QUESTION])
    metas = ['{"url": "https://spam.example/a"}', '{"url": "https://fine.example/b"}']
    batch = batch.set_column(batch.schema.get_field_index("meta"), "meta", pa.array(metas))
    _, quarantined, stats = apply_safety(batch, checks)
    assert quarantined.column("reason").to_pylist() == ["blocked_url", "contaminated"]
    assert stats.contaminated == {"qa": 1} and stats.blocked == {"spam": 1}
    assert stats.contaminated_ngrams["qa"] == len(PY_WORD.findall(QUESTION)) - 13 + 1


def test_a_near_miss_shares_no_13_gram_and_is_kept(tmp_path):
    checks = checks_for(tmp_path, [ITEM])
    question = QUESTION.split()
    # every run of 12 benchmark words is broken by a changed word: 12-grams shared, no 13-gram
    near = " ".join(question[:12] + ["chloroplasts"] + question[13:])
    short = " ".join(question[:12])  # 12 words of the item, then other text
    kept, quarantined, _ = apply_safety(
        documents([near, short + " and then something else entirely"]), checks
    )
    assert kept.num_rows == 2 and quarantined.num_rows == 0
    # the same text with n = 12 does match: the test above is about the size, not the words
    twelve = checks_for(tmp_path, [ITEM], ngram=12)
    _, quarantined, _ = apply_safety(documents([near]), twelve)
    assert quarantined.column("reason").to_pylist() == ["contaminated"]


def test_precision_and_recall_on_a_generated_corpus(tmp_path):
    rng = random.Random(7)
    items = [
        {"id": f"q{i}", "question": " ".join(words(rng, 40)), "choices": words(rng, 4)} for i in range(200)
    ]
    checks = checks_for(tmp_path, items)
    texts, truth = [], []
    for _ in range(1_500):
        body = words(rng, rng.randint(50, 600))
        planted = rng.random() < 0.1
        if planted:  # a 13- to 40-word run of an item, case and spacing changed, somewhere inside
            item = rng.choice(items)["question"].split()
            start = rng.randint(0, len(item) - 13)
            run = item[start : start + rng.randint(13, len(item) - start)]
            run = [w.upper() if rng.random() < 0.3 else w for w in run]
            at = rng.randint(0, len(body))
            body = body[:at] + ["\n", *run, ",  "] + body[at:]
        elif rng.random() < 0.1:  # a near miss: 12 words of an item only
            item = rng.choice(items)["question"].split()
            at = rng.randint(0, len(body))
            body = body[:at] + item[:12] + body[at:]
        texts.append(" ".join(body))
        truth.append(planted)
    _, quarantined, _ = apply_safety(documents(texts), checks)
    flagged = {int(i.removeprefix("id")) for i in quarantined.column("id").to_pylist()}
    planted = {i for i, t in enumerate(truth) if t}
    precision = len(flagged & planted) / len(flagged)
    recall = len(flagged & planted) / len(planted)
    assert len(planted) > 100
    assert (precision, recall) == (1.0, 1.0)


def test_remove_mode_cuts_the_matching_span_and_keeps_the_rest(tmp_path):
    rng = random.Random(3)
    checks = checks_for(tmp_path, [ITEM], mode="remove")
    before, after = " ".join(words(rng, 50)), " ".join(words(rng, 50))
    text = f"{before}\n{QUESTION.lower()}? {after}"
    kept, quarantined, stats = apply_safety(documents([text, QUESTION]), checks)
    assert kept.column("text").to_pylist() == [f"{before} ? {after}"], "the words go, the rest stays"
    assert stats.spans_removed == 1 and stats.documents_cut == 1
    # a document that is nothing but the item has nothing left: quarantined
    assert quarantined.column("reason").to_pylist() == ["contaminated"]
    assert "nothing left" in quarantined.column("detail")[0].as_py()
    # what was kept no longer shares an n-gram with the benchmark
    _, again, _ = apply_safety(kept, checks)
    assert again.num_rows == 0


def test_words_of_mixed_ascii_and_unicode_texts_are_pythons_words_lower_cased():
    """The compiled words (runs of the word bitmap, a run with a non-ASCII byte lower-cased by
    the code-point table and split at characters that are no letter or digit) are Python's
    ``[^\\W_]+`` words lower-cased, in texts with and without non-ASCII characters."""
    rng = random.Random(7)
    pieces = ["Énergie", "CINÉTIQUE", "straße", "naïve", "ΑΒΓ", "中文", "x—y", "a–b…c", "Ünï_code",
              "plain", "ASCII", "w0rd5", "1234567890abcdefghij", "é", "—", " ", "\n", ", ", "_", "--"]  # fmt: skip
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60))) for _ in range(200)]
    texts += ["only ascii words here", "", "ü"]
    # ASCII texts with words of every length from 1 to 41 bytes (their bytes past the eighth)
    texts += [" ".join("Ab9" * k + "x" * j for k in range(14) for j in range(3)), "z" * 41]
    batch = batch_bytes(pa.array(texts, pa.string()))
    assert not batch.ascii.all() and batch.ascii.any()
    grams, text_of, counts = ngram_hashes(
        batch.data, batch.view, batch.maps.words, batch.maps.high, batch.ascii, batch.offsets, 1,
        LOWER_WORD, batch.lower,
    )  # fmt: skip
    for index, text in enumerate(texts):
        expected = [w.lower() for w in PY_WORD.findall(text)]
        assert counts[index] == len(expected), text
        if expected:
            hashes = mix64(string_hashes(pa.array(expected, pa.string())))
            assert np.array_equal(grams[text_of == index], hashes), text


def test_memory_is_eight_bytes_an_ngram_with_bucket_starts_and_a_filter_of_12_to_24_bits_an_ngram(tmp_path):
    rng = random.Random(1)
    items = [{"id": str(i), "question": " ".join(words(rng, 100)), "choices": []} for i in range(100)]
    benchmarks = checks_for(tmp_path, items).benchmarks
    assert benchmarks is not None
    assert benchmarks.ngrams == 100 * (100 - 13 + 1)  # 8800: 2**13 <= 8800 < 2**14
    assert benchmarks.bits == 10  # 8 to 16 n-grams a bucket
    assert len(benchmarks.filter) == 1 << 11  # 2**11 words: the power of two at or above 12 bits an n-gram
    assert benchmarks.nbytes == 8 * benchmarks.ngrams + 4 * ((1 << 10) + 1) + 8 * (1 << 11)
    assert benchmarks.facts["qa"]["items"] == 100


def test_the_bloom_filter_passes_every_ngram_of_the_set_and_few_others():
    rng = np.random.default_rng(5)
    hashes = np.unique(rng.integers(0, 2**63, 200_000, np.uint64) * np.uint64(2))
    benchmarks = BenchmarkSet.of_hashes(
        13, ["b"], np.zeros(1, np.int64), ["0"], hashes, np.zeros(len(hashes))
    )
    words, shift = benchmarks.lookup_args()[:2]
    assert may_hold(hashes, words, shift).all()
    others = rng.integers(0, 2**63, 200_000, np.uint64) * np.uint64(2) + np.uint64(1)
    assert may_hold(others, words, shift).mean() < 0.05  # 8 to 16 bits an n-gram, three bits each


def test_a_missing_file_or_field_fails_with_one_sentence(tmp_path):
    missing = DecontaminationConfig(
        benchmarks=[BenchmarkConfig(name="qa", path=str(tmp_path / "no.jsonl"), fields=["q"])]
    )
    with pytest.raises(BenchmarkError, match=r"benchmark 'qa': file .*no.jsonl does not exist"):
        BenchmarkSet.build(missing)
    bench = write_benchmark(tmp_path / "qa.jsonl", [ITEM])
    wrong = DecontaminationConfig(benchmarks=[BenchmarkConfig(name="qa", path=str(bench), fields=["prompt"])])
    with pytest.raises(BenchmarkError, match="no record of qa.jsonl has field 'prompt'"):
        BenchmarkSet.build(wrong)


def test_parquet_benchmarks_read_the_named_columns(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"uid": ["p1"], "prompt": [QUESTION], "answer": ["energy"]}), path)
    config = DecontaminationConfig(
        benchmarks=[BenchmarkConfig(name="pq", path=str(path), fields=["prompt"], id_field="uid")]
    )
    checks = SafetyChecks(SafetyConfig(decontamination=config), BenchmarkSet.build(config))
    _, quarantined, _ = apply_safety(documents([f"intro. {QUESTION}. outro"]), checks)
    assert "benchmark pq item p1" in quarantined.column("detail")[0].as_py()
    with pytest.raises(BenchmarkError, match="has no column 'question'"):
        BenchmarkSet.build(
            DecontaminationConfig(
                benchmarks=[BenchmarkConfig(name="pq", path=str(path), fields=["question"])]
            )
        )


# what follows the two sources of curate_support.FILES_SOURCES_TOML in the test's curate config
CURATE_TOML_AFTER_FILES = """
[[ingest.sources]]
name = "web"
kind = "prose"
format = "jsonl"
path = "sources/web.jsonl"

[safety.pii]
enabled = true

[[safety.blocklist.lists]]
name = "spam"
path = "blocked_domains.txt"
kind = "domains"

[shards]
vocab_size = 300
seq_len = 64
tokenizer_sample_mb = 1.0

[gates]
min_documents = 10
min_tokens = 1000

[repository]
spec = "repo"
results = "results"

[retry]
backoff_seconds = 0.05
"""


@pytest.mark.usefixtures("prefect_harness")
def test_decontaminate_command_on_a_published_version_reuses_ingest_validate_dedup(
    tmp_path, monkeypatch, capsys
):
    from flows.cli import main
    from tests.flows.curate_support import FILES_SOURCES_TOML, column, ran_from, stage_outcomes
    from tests.flows.test_curate_safety import write_safety_corpus
    from versioning.local import LocalRepo

    monkeypatch.setenv("TOKENLAKE_HOME", str(tmp_path / "home"))
    write_safety_corpus(tmp_path)
    config = tmp_path / "curate.toml"
    config.write_text(FILES_SOURCES_TOML + CURATE_TOML_AFTER_FILES)
    assert main(["curate", "--config", str(config), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    repo = LocalRepo(tmp_path / "repo")
    assert list(repo.list(first["tag"], "eval_sets/")) == []

    benchmarks = tmp_path / "bench" / "new.toml"
    benchmarks.write_text(
        '[[benchmarks]]\nname = "opera"\npath = "opera.jsonl"\nfields = ["prompt"]\nid_field = "uid"\n'
    )
    command = ["decontaminate", "--config", str(config), "--benchmarks", str(benchmarks)]
    with stage_outcomes() as outcomes:
        assert main([*command, "--version", first["tag"], "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert outcomes == ran_from("safety")
    assert second["new"] and second["tag"] != first["tag"]
    assert [s.path for s in repo.list(second["tag"], "eval_sets/")] == [
        "eval_sets/opera/opera.jsonl",
        "eval_sets/opera/spec.json",
    ], "the version records the set it was decontaminated against"
    details = column(repo, second["tag"], "quarantine/safety/web/", "detail")
    assert sum("benchmark opera item op-9" in d for d in details) == 2

    # an older tag, or a config that changes an earlier stage, is refused with one sentence
    assert main([*command, "--version", first["tag"]]) == 2
    assert f"{first['tag']} is not main's newest version" in capsys.readouterr().err
    config.write_text(FILES_SOURCES_TOML + CURATE_TOML_AFTER_FILES + "\n[dedup]\nthreshold = 0.7\n")
    assert main(command) == 2
    assert "does not reproduce ds-" in capsys.readouterr().err
