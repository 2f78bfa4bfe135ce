"""Property tests of the ingest readers over generated input (hypothesis).

For any input: no crash; documents in = kept + quarantined, counted from the input itself
(files given; non-blank JSONL lines; Parquet rows, or one record for a file whose schema
cannot give documents); every quarantined document has a reason and a detail; a kept
document is not blank.

Inputs: arbitrary bytes as files (raw, gzip, zstd, UTF-16/UTF-8 with BOMs, text in other
encodings); JSONL lines that are random JSON values, objects with odd ``text`` fields,
broken JSON, lines in other encodings and lines past ``max_doc_bytes``, written plain (split
into small byte-range partitions), gzip- or zstd-compressed, or compressed and cut short;
Parquet files with random columns, types, null patterns and row groups.

The CI run is bounded and derandomised (the same examples every run: a generated input can
never make the suite flaky); ``benchmarks/chaos/fuzz_readers.py`` runs the same properties
with many random examples (``TOKENLAKE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.ingest import (
    IngestConfig,
    SourceConfig,
    check_source,
    ingest_partition,
    plan_partitions,
)
from tasks.stage import ConfigError

LONG_RUN = int(os.environ.get("TOKENLAKE_FUZZ_EXAMPLES", "0"))
settings.register_profile(
    "tokenlake-ci", max_examples=40, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
settings.register_profile(
    "tokenlake-long", max_examples=max(LONG_RUN, 1), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
PROFILE = settings.get_profile("tokenlake-long" if LONG_RUN else "tokenlake-ci")
ENCODINGS = [
    "utf-8",
    "utf-8-sig",
    "utf-16",
    "utf-16-le",
    "utf-16-be",
    "utf-32",
    "latin-1",
    "cp1252",
    "shift_jis",
]


def ingest(
    source: SourceConfig, config: IngestConfig, files: list[tuple[str, str]]
) -> tuple[pa.Table, pa.Table]:
    kept, quarantined = [], []
    for partition in plan_partitions(source, config, files=files):
        k, q = ingest_partition(source, partition, config)
        kept.append(k)
        quarantined.append(q)
    return pa.concat_tables(kept), pa.concat_tables(quarantined)


def check_accounting(kept: pa.Table, quarantined: pa.Table, documents_in: int | None) -> None:
    if documents_in is not None:
        assert kept.num_rows + quarantined.num_rows == documents_in
    reasons, details = quarantined.column("reason").to_pylist(), quarantined.column("detail").to_pylist()
    assert all(isinstance(r, str) and r for r in reasons), reasons
    assert all(isinstance(d, str) for d in details), details
    assert all(t.strip() for t in kept.column("text").to_pylist())
    assert set(quarantined.column("stage").to_pylist()) <= {"ingest"}


def only_config_errors(source: SourceConfig) -> None:
    """The fail-fast check of a source may refuse it (one sentence), never crash."""
    try:
        check_source(source)
    except ConfigError as exc:
        assert str(exc).startswith(f"source {source.name!r}")


# ---- files ----------------------------------------------------------------------------------------


def encoded_text(draw) -> bytes:
    text = draw(st.text(max_size=300))
    encoding = draw(st.sampled_from(ENCODINGS))
    return text.encode(encoding, errors="replace")


@st.composite
def file_payloads(draw) -> tuple[str, bytes]:
    kind = draw(
        st.sampled_from(["bytes", "text", "gzip", "zstd", "utf16-bom-le", "utf16-bom-be", "utf8-bom"])
    )
    data = draw(st.binary(max_size=2048)) if kind == "bytes" or draw(st.booleans()) else encoded_text(draw)
    if kind == "gzip":
        return ".gz", gzip.compress(data)
    if kind == "zstd":
        return ".zst", zstandard.ZstdCompressor().compress(data)
    if kind == "utf16-bom-le":
        return ".txt", b"\xff\xfe" + data
    if kind == "utf16-bom-be":
        return ".txt", b"\xfe\xff" + data
    if kind == "utf8-bom":
        return ".txt", b"\xef\xbb\xbf" + data
    return ".txt", data


@settings(PROFILE)
@given(
    payloads=st.lists(file_payloads(), min_size=1, max_size=8),
    max_doc_bytes=st.integers(1, 3000),
    min_chars=st.integers(1, 40),
)
def test_any_bytes_as_files_are_kept_or_quarantined_with_a_reason(payloads, max_doc_bytes, min_chars):
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (suffix, data) in enumerate(payloads):
            path = Path(tmp, f"doc-{i}{suffix}")
            path.write_bytes(data)
            files.append((str(path), path.name))
        source = SourceConfig(name="fuzz", kind="prose", format="files", path=tmp, min_chars=min_chars)
        kept, quarantined = ingest(
            source, IngestConfig(max_doc_bytes=max_doc_bytes, partition_bytes=1024), files
        )
        check_accounting(kept, quarantined, len(files))
        only_config_errors(source)


# ---- JSONL ------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def jsonl_lines(draw, max_doc_bytes: int) -> bytes:
    kind = draw(st.sampled_from(["value", "object", "broken", "bytes", "encoded", "huge"]))
    if kind == "value":
        return json.dumps(draw(json_values)).encode()
    if kind == "object":
        text = draw(st.text(max_size=200) | json_values)
        record = {"text": text} if draw(st.booleans()) else {"body": text}
        if draw(st.booleans()):
            record["id"] = draw(st.none() | st.integers() | st.text(max_size=10))
        return json.dumps(record, ensure_ascii=draw(st.booleans())).encode()
    if kind == "broken":
        whole = json.dumps({"text": draw(st.text(max_size=100))}).encode()
        return whole[: draw(st.integers(0, max(len(whole) - 1, 0)))]
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "encoded":
        text = json.dumps({"text": draw(st.text(max_size=100))}, ensure_ascii=False)
        return text.encode(draw(st.sampled_from(ENCODINGS)), errors="replace")
    return b'{"text": "' + b"x" * (max_doc_bytes + draw(st.integers(1, 3000))) + b'"}'


def non_blank_lines(data: bytes, max_doc_bytes: int) -> int:
    """Records a JSONL file holds: every line (the last may lack its newline) that is too long or not blank."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return sum(1 for line in lines if len(line) > max_doc_bytes or line.strip())


@st.composite
def jsonl_files(draw) -> tuple[int, str, bytes, bytes, str]:
    """(max_doc_bytes, suffix, the lines, the bytes stored, how they are wrapped)."""
    max_doc_bytes = draw(st.integers(64, 4096))
    lines = draw(st.lists(jsonl_lines(max_doc_bytes), max_size=30))
    data = b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")
    wrapper = draw(st.sampled_from(["plain", "gzip", "zstd", "gzip-cut", "zstd-cut"]))
    if wrapper == "plain":
        return max_doc_bytes, ".jsonl", data, data, wrapper
    gz = wrapper.startswith("gzip")
    stored = gzip.compress(data) if gz else zstandard.ZstdCompressor().compress(data)
    if wrapper.endswith("cut"):
        stored = stored[: draw(st.integers(0, len(stored) - 1))]
    return max_doc_bytes, ".jsonl.gz" if gz else ".jsonl.zst", data, stored, wrapper


@settings(PROFILE)
@given(file=jsonl_files(), partition_bytes=st.integers(1, 512), id_field=st.sampled_from([None, "id"]))
def test_any_jsonl_lines_are_kept_or_quarantined_with_a_reason(file, partition_bytes, id_field):
    max_doc_bytes, suffix, data, stored, wrapper = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, f"lines{suffix}")
        path.write_bytes(stored)
        source = SourceConfig(name="fuzz", kind="prose", format="jsonl", path=str(path), id_field=id_field)
        config = IngestConfig(max_doc_bytes=max_doc_bytes, partition_bytes=partition_bytes)
        kept, quarantined = ingest(source, config, [(str(path), path.name)])
        lines = non_blank_lines(data, max_doc_bytes)
        if not wrapper.endswith("cut"):
            check_accounting(kept, quarantined, lines)
        else:  # the lines before the cut, and one record saying the stream was cut
            check_accounting(kept, quarantined, None)
            assert kept.num_rows + quarantined.num_rows <= lines + 1
            if stored:
                assert {"truncated_file", "unreadable_file"} & set(quarantined.column("reason").to_pylist())
        if id_field is None:
            ids = kept.column("id").to_pylist() + quarantined.column("id").to_pylist()
            assert len(ids) == len(set(ids))
        only_config_errors(source)


# ---- Parquet -----------------------------------------------------------------------------------------

COLUMN_TYPES = {
    "string": (pa.string(), st.text(max_size=60)),
    "large_string": (pa.large_string(), st.text(max_size=60)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=True)),
    "binary": (pa.binary(), st.binary(max_size=60)),
    "bool": (pa.bool_(), st.booleans()),
    "list<string>": (pa.list_(pa.string()), st.lists(st.text(max_size=10), max_size=3)),
    "null": (pa.null(), st.none()),
}


@st.composite
def parquet_tables(draw) -> tuple[pa.Table, str, bool]:
    rows = draw(st.integers(0, 40))
    names = draw(
        st.lists(st.sampled_from(["text", "id", "body", "meta", "x"]), min_size=1, max_size=4, unique=True)
    )
    columns = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(COLUMN_TYPES)))
        if name == "text" and draw(st.booleans()):
            kind = "string"  # a usable text column more often than not
        arrow_type, values = COLUMN_TYPES[kind]
        null_share = draw(st.sampled_from([0.0, 0.2, 1.0]))
        cells = [None if draw(st.floats(0, 1)) < null_share else draw(values) for _ in range(rows)]
        array = pa.array(cells, arrow_type)
        if kind == "string" and draw(st.booleans()):
            array = array.dictionary_encode()
        columns[name] = array
    id_field = "id" if "id" in names and draw(st.booleans()) else None
    return pa.table(columns), id_field, draw(st.integers(1, 16))


def parquet_problem(table: pa.Table, id_field: str | None) -> bool:
    if "text" not in table.column_names or (id_field and id_field not in table.column_names):
        return True
    text_type = table.schema.field("text").type
    text_type = text_type.value_type if pa.types.is_dictionary(text_type) else text_type
    return not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type))


@settings(PROFILE)
@given(generated=parquet_tables(), partition_bytes=st.integers(1, 4096))
def test_any_parquet_schema_and_null_pattern_is_kept_or_quarantined_with_a_reason(generated, partition_bytes):
    table, id_field, row_group_size = generated
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "rows.parquet")
        pq.write_table(table, path, row_group_size=row_group_size)
        source = SourceConfig(name="fuzz", kind="prose", format="parquet", path=str(path), id_field=id_field)
        kept, quarantined = ingest(
            source, IngestConfig(partition_bytes=partition_bytes), [(str(path), path.name)]
        )
        if parquet_problem(table, id_field):
            check_accounting(kept, quarantined, 1)  # the whole file, once, whatever its row groups
            assert quarantined.column("reason").to_pylist() == ["wrong_parquet_schema"]
            assert f"; {table.num_rows} rows" in quarantined.column("detail")[0].as_py()
        else:
            check_accounting(kept, quarantined, table.num_rows)
            missing = quarantined.column("reason").to_pylist().count("missing_field")
            assert missing >= table.column("text").null_count
        only_config_errors(source)


def test_the_ci_run_is_bounded_and_derandomised():
    if LONG_RUN:
        pytest.skip("a long run asked for random examples")
    assert PROFILE.derandomize and PROFILE.max_examples <= 40
