"""A bad-input corpus, generated here: nothing crashes, every case is quarantined with its
reason, and documents in = kept + quarantined for every source.

"Unreadable" files: tests run as root, and root reads a mode-000 file, so unreadable files
are made as a broken symlink and a FIFO (opening a FIFO would block; ingest refuses it
from its file type without opening it).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import unicodedata
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks.ingest import IngestConfig, SourceConfig, ingest_partition, plan_partitions

GOOD = "A perfectly ordinary document with enough words to be kept by ingest.\n"
FIFTY_MB = 50 * 1024 * 1024


def _jsonl(*records: object) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _ingest(source: SourceConfig, config: IngestConfig) -> tuple[pa.Table, pa.Table]:
    kept, quarantined = [], []
    for partition in plan_partitions(source, config):
        k, q = ingest_partition(source, partition, config)
        kept.append(k)
        quarantined.append(q)
    return pa.concat_tables(kept), pa.concat_tables(quarantined)


def _reasons(quarantined: pa.Table) -> dict[str, str]:
    return dict(
        zip(quarantined.column("locator").to_pylist(), quarantined.column("reason").to_pylist(), strict=True)
    )


@pytest.fixture(scope="module")
def files_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("files")
    (root / "good.txt").write_text(GOOD)
    (root / "bom_crlf_nfd.txt").write_bytes(
        b"\xef\xbb\xbf" + "Cafe\u0301 line one\r\nline two\rline three\n".encode()
    )
    (root / "invalid_utf8.txt").write_bytes(GOOD.encode() + b"\xff\xfe\xfd broken")
    (root / "utf16_no_bom.txt").write_bytes(GOOD.encode("utf-16-le"))
    (root / "binary.bin").write_bytes(random.Random(0).randbytes(4096))
    (root / "empty.txt").write_bytes(b"")
    (root / "whitespace.txt").write_text(" \n\t\n  ")
    (root / "nul_bytes.txt").write_bytes(
        b"text with a\x00 few\x00 NUL bytes and \x07 a bell, " + GOOD.encode()
    )
    (root / "short.txt").write_text("hi")
    (root / "big.txt").write_bytes(b"x" * (2 * 1024 * 1024))
    (root / "sub").mkdir()
    (root / "sub" / "nested.txt").write_text(GOOD)
    os.symlink(root / "does-not-exist", root / "broken_link.txt")
    os.mkfifo(root / "fifo.txt")
    return root


def test_files_corpus_each_case_has_its_reason(files_corpus: Path) -> None:
    source = SourceConfig(name="files", kind="prose", format="files", path=str(files_corpus), min_chars=5)
    config = IngestConfig(sources=[source], max_doc_bytes=1024 * 1024)
    kept, quarantined = _ingest(source, config)

    assert _reasons(quarantined) == {
        "invalid_utf8.txt": "undecodable",
        "utf16_no_bom.txt": "undecodable",
        "binary.bin": "binary",
        "empty.txt": "empty",
        "whitespace.txt": "empty",
        "short.txt": "too_short",
        "big.txt": "too_long",
        "broken_link.txt": "unreadable_file",
        "fifo.txt": "unreadable_file",
    }
    texts = dict(zip(kept.column("locator").to_pylist(), kept.column("text").to_pylist(), strict=True))
    assert sorted(texts) == ["bom_crlf_nfd.txt", "good.txt", "nul_bytes.txt", "sub/nested.txt"]
    assert texts["bom_crlf_nfd.txt"] == unicodedata.normalize("NFC", "Café line one\nline two\nline three\n")
    assert "\x00" not in texts["nul_bytes.txt"] and "\x07" not in texts["nul_bytes.txt"]
    assert texts["nul_bytes.txt"].startswith("text with a few NUL bytes and  a bell")
    # nothing lost: every listed file is either kept or quarantined, once
    assert kept.num_rows + quarantined.num_rows == len(list(files_corpus.rglob("*"))) - 1  # minus the folder
    assert set(quarantined.column("stage").to_pylist()) == {"ingest"}
    detail = dict(
        zip(quarantined.column("locator").to_pylist(), quarantined.column("detail").to_pylist(), strict=True)
    )
    assert "UTF-16" in detail["utf16_no_bom.txt"]
    assert "FIFO" in detail["fifo.txt"] or "p" in detail["fifo.txt"].split("mode ")[1]


@pytest.fixture(scope="module")
def jsonl_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jsonl")
    lines = [
        orjson.dumps({"text": GOOD, "url": "a"}),  # 1 kept
        b"",  # 2 blank: not a record
        b"{not json at all",  # 3 malformed
        orjson.dumps(["a", "list"]),  # 4 not an object
        orjson.dumps({"body": GOOD}),  # 5 no text field
        orjson.dumps({"text": 12345}),  # 6 wrong type
        b'{"text": "bad \xff\xfe bytes"}',  # 7 invalid UTF-8
        b'{"text": "lone \\ud800 surrogate"}',  # 8 a surrogate cannot be UTF-8
        orjson.dumps({"text": "\x00\x01\x02\x03\x04\x05" * 20}),  # 9 control characters only
        orjson.dumps({"text": "   "}),  # 10 empty after normalisation
        orjson.dumps({"text": "ok line with a NUL\x00 in it " + GOOD}),  # 11 kept, NUL removed
    ]
    with open(root / "a.jsonl", "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
        f.write(b'{"text": "' + b"y" * FIFTY_MB + b'"}\n')  # 12: the 50 MB single line
        f.write(orjson.dumps({"text": GOOD}) + b"\n")  # 13 kept
        f.write(b'{"text": "truncated rec')  # 14: the last record is cut off
    good = _jsonl(*({"text": f"{GOOD} number {i}"} for i in range(50)))
    compressed = gzip.compress(good)
    (root / "b_truncated.jsonl.gz").write_bytes(compressed[: len(compressed) * 2 // 3])
    zstd = zstandard.ZstdCompressor().compress(good)
    (root / "c_truncated.jsonl.zst").write_bytes(zstd[: len(zstd) // 2])
    (root / "d_corrupt.jsonl.gz").write_bytes(b"this is not gzip data")
    (root / "e_good.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(good))
    return root


def test_jsonl_corpus_each_case_has_its_reason(jsonl_corpus: Path) -> None:
    source = SourceConfig(name="lines", kind="prose", format="jsonl", path=str(jsonl_corpus), min_chars=3)
    config = IngestConfig(sources=[source])
    kept, quarantined = _ingest(source, config)
    reasons = _reasons(quarantined)

    assert {k: v for k, v in reasons.items() if k.startswith("a.jsonl")} == {
        "a.jsonl:3": "malformed_jsonl",
        "a.jsonl:4": "malformed_jsonl",
        "a.jsonl:5": "missing_field",
        "a.jsonl:6": "wrong_field_type",
        "a.jsonl:7": "undecodable",
        "a.jsonl:8": "undecodable",
        "a.jsonl:9": "binary",
        "a.jsonl:10": "empty",
        "a.jsonl:12": "too_long",
        "a.jsonl:14": "malformed_jsonl",
    }
    kept_locators = kept.column("locator").to_pylist()
    assert [loc for loc in kept_locators if loc.startswith("a.jsonl")] == [
        "a.jsonl:1",
        "a.jsonl:11",
        "a.jsonl:13",
    ]
    # a truncated stream keeps what came before the cut and quarantines the rest as one record
    truncated = {k: v for k, v in reasons.items() if k.startswith(("b_", "c_"))}
    assert sorted(set(truncated.values())) == ["truncated_file"]
    gz_kept = [loc for loc in kept_locators if loc.startswith("b_truncated")]
    assert 0 < len(gz_kept) < 50
    assert f"b_truncated.jsonl.gz:{len(gz_kept) + 1}" in truncated
    assert reasons["d_corrupt.jsonl.gz:1"] == "unreadable_file"
    assert len([loc for loc in kept_locators if loc.startswith("e_good")]) == 50
    # the 50 MB line is quarantined with a bounded preview
    big = quarantined.filter(pa.compute.equal(quarantined.column("locator"), "a.jsonl:12"))
    assert len(big.column("text")[0].as_py()) == config.quarantine_text_chars
    assert "52428812 bytes" in big.column("detail")[0].as_py()
    # counts add up: one record per non-blank line, one per broken stream
    assert Counter(reasons.values())["truncated_file"] == 2
    assert kept.num_rows + quarantined.num_rows == 13 + len(gz_kept) + 2 + 1 + 50


@pytest.fixture(scope="module")
def parquet_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    pq.write_table(
        pa.table({"text": [GOOD, None, "  ", GOOD + "!"], "doc_id": ["a", "b", "c", "d"]}),
        root / "a_good.parquet",
        row_group_size=2,
    )
    missing_text = pa.table({"body": [GOOD] * 3, "doc_id": ["e", "e2", "e3"]})
    pq.write_table(missing_text, root / "b_missing_text.parquet", row_group_size=1)
    pq.write_table(pa.table({"text": [1, 2, 3], "doc_id": ["f", "g", "h"]}), root / "c_int_text.parquet")
    (root / "d_not_parquet.parquet").write_bytes(b"PAR1 but not really")
    return root


def test_parquet_corpus_each_case_has_its_reason(parquet_corpus: Path) -> None:
    source = SourceConfig(
        name="tables", kind="prose", format="parquet", path=str(parquet_corpus), id_field="doc_id"
    )
    config = IngestConfig(sources=[source], partition_bytes=1)  # a partition per row group
    kept, quarantined = _ingest(source, config)
    assert _reasons(quarantined) == {
        "a_good.parquet:1": "missing_field",
        "a_good.parquet:2": "empty",
        "b_missing_text.parquet": "wrong_parquet_schema",
        "c_int_text.parquet": "wrong_parquet_schema",
        "d_not_parquet.parquet": "unreadable_file",
    }
    assert kept.column("locator").to_pylist() == ["a_good.parquet:0", "a_good.parquet:3"]
    assert [json.loads(m)["source_id"] for m in kept.column("meta").to_pylist()] == ["a", "d"]
    details = quarantined.column("detail").to_pylist()
    assert quarantined.num_rows == 5  # a file with a wrong schema is one record, not one per row group
    assert any("no column 'text'" in d and "3 rows" in d for d in details)
    assert any("is int64, expected a string" in d for d in details)


def test_utf16_with_a_bom_is_read_and_broken_utf16_says_at_which_byte(tmp_path: Path) -> None:
    (tmp_path / "le.txt").write_bytes(b"\xff\xfe" + GOOD.encode("utf-16-le"))
    (tmp_path / "be.txt").write_bytes(b"\xfe\xff" + GOOD.encode("utf-16-be"))
    (tmp_path / "odd_length.txt").write_bytes(b"\xff\xfe" + GOOD.encode("utf-16-le") + b"x")
    lone_surrogate = b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8" + "zz".encode("utf-16-le")
    (tmp_path / "lone_surrogate.txt").write_bytes(lone_surrogate)
    (tmp_path / "controls.txt").write_bytes(b"\xff\xfe" + ("\x01\x02\x03" * 40).encode("utf-16-le"))
    source = SourceConfig(name="utf16", kind="prose", format="files", path=str(tmp_path), min_chars=5)
    kept, quarantined = _ingest(source, IngestConfig())
    texts = dict(zip(kept.column("locator").to_pylist(), kept.column("text").to_pylist(), strict=True))
    assert texts == {"be.txt": GOOD, "le.txt": GOOD}
    found = {
        locator: (reason, detail)
        for locator, reason, detail in zip(
            *(quarantined.column(c).to_pylist() for c in ("locator", "reason", "detail")), strict=True
        )
    }
    assert found == {
        "odd_length.txt": ("undecodable", "invalid UTF-16 at byte 142: truncated data"),
        "lone_surrogate.txt": ("undecodable", "invalid UTF-16 at byte 6: illegal UTF-16 surrogate"),
        "controls.txt": (
            "binary",
            "more than binary_control_fraction 0.05 of the text is control characters",
        ),
    }
