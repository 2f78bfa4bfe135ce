"""The shard file format and manifest (formats/shards.py)."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest

from formats.shards import (
    HEADER_SIZE,
    Manifest,
    ShardEntry,
    ShardFormatError,
    ShardHeader,
    ShardWriter,
    dtype_for_vocab,
    read_shard,
    read_shard_bytes,
    shard_bytes,
    verify_shard,
    write_shard,
)

EOD = 0


def packed_rows(documents: list[list[int]], seq_len: int, dtype: str = "uint16") -> np.ndarray:
    """Documents followed by EOD, cut into rows of seq_len + 1 (tail dropped)."""
    stream = [t for doc in documents for t in [*doc, EOD]]
    n = len(stream) // (seq_len + 1)
    return np.array(stream[: n * (seq_len + 1)], dtype=dtype).reshape(n, seq_len + 1)


def entry_for(name: str, data: bytes, source: str = "web") -> ShardEntry:
    header, rows = read_shard_bytes(data)
    return ShardEntry(
        name=name,
        source=source,
        sha256=hashlib.sha256(data).hexdigest(),
        sequences=header.num_sequences,
        tokens=rows.size,
        bytes=len(data),
        documents=int((rows == header.eod_token).sum()),
    )


def manifest_for(entries: list[ShardEntry], seq_len: int, vocab_size: int = 100) -> Manifest:
    return Manifest.build(
        entries,
        seq_len=seq_len,
        dtype=dtype_for_vocab(vocab_size).name,
        vocab_size=vocab_size,
        eod_token=EOD,
        tokenizer_sha256="ab" * 32,
        input_commit="c0ffee",
    )


@pytest.mark.parametrize(
    ("vocab_size", "dtype"),
    [(1, "uint16"), (65_535, "uint16"), (65_536, "uint16"), (65_537, "uint32"), (200_000, "uint32")],
)
def test_dtype_switches_at_the_uint16_boundary(vocab_size: int, dtype: str) -> None:
    assert dtype_for_vocab(vocab_size).name == dtype


def test_dtype_for_vocab_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        dtype_for_vocab(0)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_header_round_trips_and_is_64_bytes(dtype: str) -> None:
    header = ShardHeader(np.dtype(dtype), seq_len=2048, eod_token=65_535, num_sequences=12_345)
    packed = header.pack()
    assert len(packed) == HEADER_SIZE and packed.startswith(b"TLSHARD1")
    assert ShardHeader.unpack(packed) == header


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:20], "shorter than"),
        (lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
        (lambda b: b[:8] + (7).to_bytes(4, "little") + b[12:], "version 7"),
        (lambda b: b[:12] + (3).to_bytes(4, "little") + b[16:], "dtype code 3"),
        (lambda b: b[:63] + b"\x01", "reserved"),
    ],
)
def test_header_unpack_names_what_is_wrong(mutate, reason: str) -> None:
    good = ShardHeader(np.dtype("uint16"), 8, 0, 3).pack()
    with pytest.raises(ShardFormatError, match=reason):
        ShardHeader.unpack(mutate(good))


def test_header_refuses_an_eod_that_does_not_fit_the_dtype() -> None:
    with pytest.raises(ShardFormatError, match="does not fit uint16"):
        ShardHeader(np.dtype("uint16"), 8, 70_000, 1)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_write_then_read_gives_the_same_rows(tmp_path, dtype: str) -> None:
    rows = packed_rows(
        [[5, 6, 7], [8, 9], [70_000 if dtype == "uint32" else 9_999] * 9], seq_len=4, dtype=dtype
    )
    path = tmp_path / "shard-00000.bin"
    digest = write_shard(path, rows, EOD)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    header, read = read_shard(path)
    assert header == ShardHeader(np.dtype(dtype), 4, EOD, rows.shape[0])
    np.testing.assert_array_equal(read, rows)
    assert path.stat().st_size == HEADER_SIZE + rows.size * np.dtype(dtype).itemsize
    assert [p.name for p in tmp_path.iterdir()] == ["shard-00000.bin"]  # no temp file left


def test_write_to_a_file_object_matches_the_file_on_disk(tmp_path) -> None:
    rows = packed_rows([[1, 2, 3, 4, 5, 6, 7]], seq_len=3)
    buffer = io.BytesIO()
    assert write_shard(buffer, rows, EOD) == write_shard(tmp_path / "a.bin", rows, EOD)
    assert buffer.getvalue() == (tmp_path / "a.bin").read_bytes() == shard_bytes(rows, EOD)


def test_an_empty_shard_reads_back_as_zero_rows(tmp_path) -> None:
    write_shard(tmp_path / "e.bin", np.empty((0, 9), np.uint16), EOD)
    header, rows = read_shard(tmp_path / "e.bin")
    assert header.num_sequences == 0 and rows.shape == (0, 9)


def test_writer_refuses_a_row_count_other_than_the_header_and_leaves_no_file(tmp_path) -> None:
    path = tmp_path / "short.bin"
    writer = ShardWriter(path, ShardHeader(np.dtype("uint16"), 3, EOD, num_sequences=2))
    writer.write(np.ones((1, 4), np.uint16))
    with pytest.raises(ShardFormatError, match="got 1 rows but its header declares 2"):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_token_ids_that_do_not_fit() -> None:
    writer = ShardWriter(io.BytesIO(), ShardHeader(np.dtype("uint16"), 1, EOD, num_sequences=1))
    with pytest.raises(ShardFormatError, match="out of range for uint16"):
        writer.write(np.array([[1, 70_000]], np.int64))


def test_read_detects_a_truncated_shard(tmp_path) -> None:
    path = tmp_path / "shard-00003.bin"
    write_shard(path, packed_rows([[3] * 40], seq_len=7), EOD)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ShardFormatError, match="shard-00003.bin.*truncated"):
        read_shard(path)


def test_manifest_round_trips_and_its_sha256_is_the_file_sha256() -> None:
    data = shard_bytes(packed_rows([[4, 5, 6]] * 5, seq_len=3), EOD)
    manifest = manifest_for([entry_for("shards/web/shard-00000.bin", data)], seq_len=3)
    text = manifest.to_json()
    again = Manifest.from_json(text)
    assert again == manifest and again.to_json() == text
    assert manifest.sha256() == hashlib.sha256(text.encode()).hexdigest()
    assert manifest.sources == {"web": {"sequences": 5, "tokens": 20}}
    assert manifest.totals == {"sequences": 5, "tokens": 20}
    assert manifest.faults() == []


def test_manifest_refuses_unknown_fields() -> None:
    text = manifest_for([], seq_len=3).to_json().replace('"version"', '"surprise": 1, "version"')
    with pytest.raises(ValueError, match="surprise"):
        Manifest.from_json(text)


def test_manifest_faults_name_empty_unbalanced_and_wrong_totals() -> None:
    def entry(i: int, sequences: int) -> ShardEntry:
        tokens = sequences * 4
        return ShardEntry(
            name=f"shards/web/shard-{i:05d}.bin",
            source="web",
            sha256="0" * 64,
            sequences=sequences,
            tokens=tokens,
            bytes=HEADER_SIZE + 2 * tokens,
        )

    manifest = manifest_for([entry(0, 5), entry(1, 0), entry(2, 5)], seq_len=3)
    tampered = manifest.model_copy(update={"totals": {"sequences": 99, "tokens": 40}})
    faults = tampered.faults()
    assert any("shard-00001.bin: empty shard" in f for f in faults)
    assert any("differ by more than one" in f for f in faults)
    assert any(f.startswith("totals") for f in faults)


def verify(data: bytes, entry: ShardEntry | None, manifest: Manifest | None, **kw):
    return verify_shard(io.BytesIO(data), "shards/web/shard-00000.bin", entry, manifest, **kw)


def test_verify_accepts_a_good_shard_and_counts_documents() -> None:
    data = shard_bytes(packed_rows([[4, 5, 6], [7, 8], [9]], seq_len=3), EOD)
    entry = entry_for("shards/web/shard-00000.bin", data)
    manifest = manifest_for([entry], seq_len=3)
    check = verify(data, entry, manifest, starts_source=True)
    assert check.ok, check.faults
    assert (check.sequences, check.documents, check.last_token) == (2, 2, 9)


def test_verify_reports_a_bit_flip_and_a_truncation() -> None:
    data = shard_bytes(packed_rows([[4, 5, 6, 7, 8, 9, 10]] * 8, seq_len=7), EOD)
    entry = entry_for("shards/web/shard-00000.bin", data)
    manifest = manifest_for([entry], seq_len=7)
    flipped = bytearray(data)
    flipped[HEADER_SIZE + 10] ^= 0x04
    assert any("sha256" in f for f in verify(bytes(flipped), entry, manifest).faults)
    faults = verify(data[:-3], entry, manifest).faults
    assert any(f.startswith("truncated") for f in faults)
    header_flip = bytearray(data)
    header_flip[1] ^= 0x01
    assert any("bad magic" in f for f in verify(bytes(header_flip), entry, manifest).faults)


def test_verify_reports_tokens_outside_the_vocabulary() -> None:
    data = shard_bytes(np.array([[1, 2, 500, 0]], np.uint16), EOD)
    entry = entry_for("shards/web/shard-00000.bin", data)
    faults = verify(data, entry, manifest_for([entry], seq_len=3, vocab_size=100)).faults
    assert faults == ["token id 500 is outside the vocabulary (100)"]


def test_verify_checks_end_of_document_placement() -> None:
    adjacent = shard_bytes(np.array([[1, 0], [0, 2]], np.uint16), EOD)  # EOD EOD across a row boundary
    assert any("adjacent" in f for f in verify(adjacent, None, None).faults)
    leading = shard_bytes(np.array([[0, 1], [2, 0]], np.uint16), EOD)
    assert verify(leading, None, None).ok  # may be the middle of a source
    assert any("starts with" in f for f in verify(leading, None, None, starts_source=True).faults)
    assert any("adjacent" in f for f in verify(leading, None, None, previous_token=EOD).faults)


def test_verify_reports_a_document_count_that_differs_from_the_manifest() -> None:
    data = shard_bytes(np.array([[1, 0, 2, 0]], np.uint16), EOD)
    entry = entry_for("shards/web/shard-00000.bin", data).model_copy(update={"documents": 3})
    faults = verify(data, entry, manifest_for([entry], seq_len=3)).faults
    assert faults == ["2 end-of-document tokens, manifest says 3"]
