"""Benchmark decontamination: the word n-grams of every benchmark item as 64-bit hashes,
held as sorted fingerprints in buckets, and the documents that share one.

Memory: a distinct n-gram takes 4 bytes for the low 32 bits of its hash and 4 for the index
of the item that holds it (the detail names the item); its bucket, the hash's top ``bits``
bits (8 to 16 n-grams a bucket), is where it lies in the sorted array, and the bucket starts
take 4 bytes per bucket. A blocked Bloom filter of 12 to 24 bits an n-gram (a power of two of
64-bit words; the hash's top bits choose the word, three 6-bit fields of its low bits the
three bits it sets there) turns all but about 3 in 1,000 of a document's n-grams away before
they read a bucket; a bitmap of one bit an n-gram and 4 bits an n-gram, as before, let one in
five through, and the bucket reads were a third of the lookup time (``benchmarks/safety.py``
on its set of 1 M n-grams). 10 to 12 bytes an n-gram: a 10 M n-gram set takes about 101 MB
(``benchmarks/safety.py`` prints the measured figure). The lookups run in
:func:`tasks.safety.scan.find_ngrams`, every n-gram of a batch in one compiled pass.

False matches: a document's n-gram matches a different benchmark n-gram when the two hashes
agree on the ``bits + 32`` bits kept (and pass the filter), at most
``occupancy * 2**-32`` per n-gram checked (the occupancy, n-grams per bucket, is 8 to 16):
about 2.2e-9 per n-gram checked for a 10 M set, one false match in some 4.5e8 n-grams (the
full 64-bit hashes would give 5e-13, at 137 MB).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.safety import scan
from tasks.safety.config import BenchmarkConfig, DecontaminationConfig
from tasks.safety.words import LOWER_WORD, BatchBytes, batch_bytes, string_hashes, text_words
from tasks.stage import ConfigError

MIN_BUCKET_BITS = 8
BUCKET_BITS_BELOW = 4  # 2**(bit length of N - 4) buckets: 8 to 16 n-grams a bucket
FILTER_BITS_PER_NGRAM = 12  # at least: the filter has the power of two of words at or above it
MIN_FILTER_WORD_BITS = 6


def filter_word_bits(ngrams: int) -> int:
    """log2 of the Bloom filter's words for a set of ``ngrams``: 12 to 24 bits an n-gram."""
    return max(math.ceil(math.log2(max(ngrams, 1) * FILTER_BITS_PER_NGRAM / 64)), MIN_FILTER_WORD_BITS)


class BenchmarkError(ConfigError):
    """A benchmark file that cannot be used as configured; the message names what to fix."""


def read_items(benchmark: BenchmarkConfig) -> tuple[list[str], list[str]]:
    """``(item ids, item texts)`` of a benchmark file (its fields' strings joined by spaces)."""
    path = Path(benchmark.path)
    if not path.is_file():
        raise BenchmarkError(f"benchmark {benchmark.name!r}: file {benchmark.path} does not exist")
    wanted = [*benchmark.fields, *([benchmark.id_field] if benchmark.id_field else [])]
    if benchmark.format == "parquet":
        table = pq.read_table(path)
        missing = [f for f in wanted if f not in table.column_names]
        if missing:
            raise BenchmarkError(
                f"benchmark {benchmark.name!r}: {path.name} has no column {missing[0]!r} "
                f"(columns: {', '.join(table.column_names)})"
            )
        records = table.select(wanted).to_pylist()
    else:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            records = []
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    raise BenchmarkError(
                        f"benchmark {benchmark.name!r}: line {number} of {path.name} is not JSON"
                    ) from None
        for field_name in wanted:
            if records and all(field_name not in r for r in records):
                raise BenchmarkError(
                    f"benchmark {benchmark.name!r}: no record of {path.name} has field {field_name!r} "
                    f"(fields: {', '.join(sorted(records[0]))})"
                )
    ids, texts = [], []
    for number, record in enumerate(records):
        ids.append(str(record.get(benchmark.id_field)) if benchmark.id_field else str(number))
        texts.append(" ".join(_strings([record.get(f) for f in benchmark.fields])))
    return ids, texts


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return [] if value is None else [str(value)]


@dataclass
class BenchmarkSet:
    """The n-grams of every configured benchmark, in order of their 64-bit hash:
    ``fingerprints[i]`` its low 32 bits, ``items[i]`` the global item index of the first item
    that holds it, ``buckets[b] .. buckets[b + 1]`` the n-grams whose top ``bits`` bits are b."""

    n: int
    names: list[str]  # benchmark of each global item range
    item_starts: np.ndarray  # global index of each benchmark's first item
    item_ids: list[str]
    bits: int
    filter: np.ndarray = field(repr=False)  # the blocked Bloom filter, uint64 words
    buckets: np.ndarray = field(repr=False)
    fingerprints: np.ndarray = field(repr=False)
    items: np.ndarray = field(repr=False)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def build(cls, config: DecontaminationConfig) -> BenchmarkSet:
        names, starts, all_ids, all_hashes, all_items, facts = [], [], [], [], [], {}
        for benchmark in config.benchmarks:
            ids, texts = read_items(benchmark)
            batch = batch_bytes(pa.array(texts, pa.string()))
            grams, item_of, lengths = scan.ngram_hashes(
                batch.data, batch.view, batch.maps.words, batch.maps.high, batch.ascii, batch.offsets, config.ngram,
                LOWER_WORD, batch.lower,
            )  # fmt: skip
            names.append(benchmark.name)
            starts.append(len(all_ids))
            all_hashes.append(grams)
            all_items.append((item_of + len(all_ids)).astype(np.uint32))
            digest = hashlib.sha256(Path(benchmark.path).read_bytes()).hexdigest()
            facts[benchmark.name] = {
                "file": Path(benchmark.path).name,
                "sha256": digest,
                "items": len(texts),
                "items_shorter_than_ngram": int((lengths < config.ngram).sum()),
                "ngrams": len(grams),
            }
            all_ids += ids
        hashes = np.concatenate(all_hashes) if all_hashes else np.empty(0, np.uint64)
        items = np.concatenate(all_items) if all_items else np.empty(0, np.uint32)
        hashes, first = np.unique(hashes, return_index=True)  # sorted; first item per n-gram
        return cls.of_hashes(
            config.ngram, names, np.asarray(starts, np.int64), all_ids, hashes, items[first], facts
        )

    @classmethod
    def of_hashes(
        cls,
        n: int,
        names: list[str],
        item_starts: np.ndarray,
        item_ids: list[str],
        hashes: np.ndarray,
        items: np.ndarray,
        facts: dict[str, dict[str, Any]] | None = None,
    ) -> BenchmarkSet:
        """The set of sorted, distinct ``hashes`` (``items``: the item of each)."""
        bits = max(int(len(hashes)).bit_length() - BUCKET_BITS_BELOW, MIN_BUCKET_BITS)
        buckets = np.searchsorted(hashes >> np.uint64(64 - bits), np.arange((1 << bits) + 1, dtype=np.uint64))
        return cls(
            n,
            names,
            item_starts,
            item_ids,
            bits,
            scan.bloom_filter(hashes, filter_word_bits(len(hashes))),
            buckets.astype(np.uint32),
            (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32),
            items.astype(np.uint32),
            facts or {},
        )

    @property
    def ngrams(self) -> int:
        return len(self.fingerprints)

    @property
    def nbytes(self) -> int:
        return int(self.filter.nbytes + self.buckets.nbytes + self.fingerprints.nbytes + self.items.nbytes)

    def lookup_args(self) -> tuple:
        """What the compiled lookups take: the filter, its shift, the buckets, theirs, the fingerprints."""
        return (
            self.filter,
            np.uint64(64 - (len(self.filter).bit_length() - 1)),
            self.buckets,
            np.uint64(64 - self.bits),
            self.fingerprints,
        )

    def item(self, index: int) -> tuple[str, str]:
        """(benchmark name, item id) of a global item index."""
        which = int(np.searchsorted(self.item_starts, index, side="right")) - 1
        return self.names[which], self.item_ids[index]

    def matches(
        self, batch: BatchBytes, skip: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(text, first word, item index)`` of every n-gram of ``batch`` that is in the set
        (texts where ``skip`` is set are passed over)."""
        capacity = 4096
        skip = np.zeros(len(batch.offsets) - 1, np.bool_) if skip is None else skip
        while True:
            count, text, word, at = scan.find_ngrams(
                batch.data, batch.view, batch.maps.words, batch.maps.high, batch.ascii, skip, batch.offsets, self.n,
                LOWER_WORD, batch.lower, *self.lookup_args(), capacity,
            )  # fmt: skip
            if count <= capacity:
                return text[:count], word[:count], self.items[at[:count]].astype(np.int64)
            capacity = count


@dataclass
class Contamination:
    """What one batch shares with the benchmarks: per text, its first match as a detail, and the
    benchmarks it matched."""

    detail: dict[int, str] = field(default_factory=dict)  # text index -> detail of its first match
    benchmarks: dict[int, set[str]] = field(default_factory=dict)
    ngrams: Counter = field(default_factory=Counter)  # benchmark -> n-grams matched


def find_contamination(
    texts: pa.Array, benchmarks: BenchmarkSet, batch: BatchBytes | None = None, skip: np.ndarray | None = None
) -> Contamination:
    """Every text that shares an n-gram with a benchmark item (``batch``: the bytes of
    ``texts``, when the caller has them; texts where ``skip`` is set are passed over)."""
    found = Contamination()
    if benchmarks.ngrams == 0 or len(texts) == 0:
        return found
    batch = batch or batch_bytes(texts)
    hit_texts, first_words, items = benchmarks.matches(batch, skip)
    if not len(hit_texts):
        return found
    which = np.searchsorted(benchmarks.item_starts, items, side="right") - 1  # benchmark of each hit
    for index, count in enumerate(np.bincount(which, minlength=len(benchmarks.names)).tolist()):
        if count:
            found.ngrams[benchmarks.names[index]] += count
    pairs = np.unique(np.stack([hit_texts, which]), axis=1)  # (text, benchmark) pairs
    for text, index in zip(pairs[0].tolist(), pairs[1].tolist(), strict=True):
        found.benchmarks.setdefault(text, set()).add(benchmarks.names[index])
    texts_hit, first = np.unique(hit_texts, return_index=True)  # the hits are in order of text, then word
    for text, at in zip(texts_hit.tolist(), first.tolist(), strict=True):
        name, item_id = benchmarks.item(int(items[at]))
        ngram = batch.spell(text, int(first_words[at]), benchmarks.n)
        found.detail[text] = f"benchmark {name} item {item_id}: shares the {benchmarks.n}-gram {ngram!r}"
    return found


def remove_spans(text: str, benchmarks: BenchmarkSet) -> tuple[str, int]:
    """``(text without the words of every matching n-gram, spans cut)``; each cut span becomes
    one space. Zero spans means Python's words did not reproduce the match (the caller then
    quarantines the document rather than keep it)."""
    matches = text_words(text)
    if len(matches) < benchmarks.n:
        return text, 0
    hashes = string_hashes(pa.array([m.group().lower() for m in matches], pa.string()))
    hit = scan.grams_in_set(hashes, benchmarks.n, *benchmarks.lookup_args())
    covered = np.zeros(len(matches) + 1, np.int64)
    for start in np.flatnonzero(hit).tolist():
        covered[start] += 1
        covered[start + benchmarks.n] -= 1
    inside = np.cumsum(covered)[:-1] > 0
    if not inside.any():
        return text, 0
    pieces, last, spans, word = [], 0, 0, 0
    while word < len(matches):
        if not inside[word]:
            word += 1
            continue
        first = word
        while word < len(matches) and inside[word]:
            word += 1
        pieces.append(text[last : matches[first].start()])
        last = matches[word - 1].end()
        spans += 1
    pieces.append(text[last:])
    return " ".join(p.strip() for p in pieces if p.strip()), spans
