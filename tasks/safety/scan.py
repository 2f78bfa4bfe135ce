"""Compiled passes (numba) over a batch's bytes: its words, their 64-bit hashes, the hash of
every word n-gram, and which n-grams are in a benchmark set, text by text.

A text's words come from the batch's word bitmap (:mod:`tasks.safety.bitmaps`): its edges
walked with ``trailing_zeros``, the words' first eight bytes hashed in one vectorised loop (the
longer words' rest after), a run with a non-ASCII byte lower-cased by a table per code point
(made from Arrow's ``utf8_lower``) and split where a character is no letter or digit. The
n-gram hashes are rolled over the word hashes, the set's Bloom filter read for all of them in
one loop of independent loads, then the few that pass compare the fingerprints of their bucket
(see :mod:`tasks.safety.decontaminate`). Before, a branch per byte (is it in a word?) took most
of the time: it mispredicted at every word edge.

The hashes are those of :func:`tasks.text_bytes.span_hashes` (a word's bytes 8 at a time,
mixed with its length, splitmix64's finaliser) and of a polynomial over the words,
``sum_j w[i+j] * B**(n-1-j)`` mod 2**64, mixed once more, so a set built here matches words
hashed anywhere else with the same functions. Compiled on first use and cached on disk
(``cache=True``): ``benchmarks/safety.py`` reports the first call's compile time.
"""

from __future__ import annotations

import numba
import numpy as np

from tasks.safety.bitmaps import any_set, set_runs

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_2 = np.uint64(0x94D049BB133111EB)
WORD_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so the n-gram polynomial is invertible mod 2**64
S30, S27, S31 = np.uint64(30), np.uint64(27), np.uint64(31)
ONE = np.uint64(1)
LOW32 = np.uint64(0xFFFFFFFF)
LOW6, SIX, TWELVE = np.uint64(63), np.uint64(6), np.uint64(12)
ZERO = np.uint64(0)
CASE_BIT = np.uint64(0x2020202020202020)
BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)


@numba.njit(cache=True, inline="always")
def _mix64(x):
    x = x ^ (x >> S30)
    x = x * MIX_1
    x = x ^ (x >> S27)
    x = x * MIX_2
    return x ^ (x >> S31)


@numba.njit(cache=True, inline="always")
def _word_hash(lowered, start, end):
    """``span_hashes`` of one span: the first 8 bytes with the length, then 8 bytes at a time."""
    length = end - start
    chunk = ZERO
    for k in range(min(length, 8)):
        chunk |= np.uint64(lowered[start + k]) << np.uint64(8 * k)
    h = _mix64(chunk ^ (np.uint64(length) * GOLDEN))
    at = start + 8
    while at < end:
        chunk = ZERO
        for k in range(min(end - at, 8)):
            chunk |= np.uint64(lowered[at + k]) << np.uint64(8 * k)
        h = _mix64(h ^ chunk)
        at += 8
    return h


@numba.njit(cache=True, inline="always")
def _find(gram, buckets, shift, fingerprints):
    """Where ``gram`` is in the set (its index in ``fingerprints``), or -1: its bucket (the top
    bits) bounds the fingerprints (the low 32 bits) to compare."""
    bucket = gram >> shift
    return _in_bucket(gram, fingerprints, buckets[bucket], buckets[bucket + 1])


@numba.njit(cache=True, inline="always")
def _in_bucket(gram, fingerprints, low, high):
    """Where ``gram``'s fingerprint (its low 32 bits) is among ``fingerprints[low:high]``, or -1."""
    fingerprint = np.uint32(gram & LOW32)
    for at in range(low, high):
        if fingerprints[at] == fingerprint:
            return at
    return -1


@numba.njit(cache=True, inline="always")
def _lower_text(data, start, stop, table, lower, out):
    """Write text ``data[start:stop]`` lower-cased into ``out``, every byte that is not in a
    word 0; return its length there. ``table``: per ASCII byte, itself lower-cased if a letter
    or digit, else 0. ``lower``: per code point, its lower-case code point if that is a letter
    or digit, else -1."""
    at, size = start, 0
    while at < stop:
        b = data[at]
        if b < 0x80:
            out[size] = table[b]
            size += 1
            at += 1
            continue
        width = 4 if b >= 0xF0 else 3 if b >= 0xE0 else 2 if b >= 0xC0 else 1
        if width == 1 or at + width > stop:  # a stray continuation byte stays inside its word
            out[size] = b
            size += 1
            at += 1
            continue
        point = np.int64(b) & (0x07 if width == 4 else 0x0F if width == 3 else 0x1F)
        for k in range(1, width):
            point = (point << 6) | (np.int64(data[at + k]) & 0x3F)
        at += width
        low = lower[min(point, 0x10FFFF)]
        if low < 0:
            out[size] = 0
            size += 1
        elif low < 0x80:
            out[size] = low
            size += 1
        elif low < 0x800:
            out[size], out[size + 1] = 0xC0 | (low >> 6), 0x80 | (low & 0x3F)
            size += 2
        elif low < 0x10000:
            out[size], out[size + 1] = 0xE0 | (low >> 12), 0x80 | ((low >> 6) & 0x3F)
            out[size + 2] = 0x80 | (low & 0x3F)
            size += 3
        else:
            out[size], out[size + 1] = 0xF0 | (low >> 18), 0x80 | ((low >> 12) & 0x3F)
            out[size + 2], out[size + 3] = 0x80 | ((low >> 6) & 0x3F), 0x80 | (low & 0x3F)
            size += 4
    return size


@numba.njit(cache=True, inline="always")
def _words(lowered, length, word_hash, word_start, word_end):
    """The hashes and spans of the words (runs of non-zero bytes) of ``lowered[:length]``."""
    at, words = 0, 0
    while at < length:
        if lowered[at] == 0:
            at += 1
            continue
        first = at
        while at < length and lowered[at] != 0:
            at += 1
        word_hash[words] = _word_hash(lowered, first, at)
        word_start[words], word_end[words] = first, at
        words += 1
    return words


@numba.njit(cache=True, inline="always")
def _rolling_grams(word_hash, words, n, grams):
    """``grams[i]``: the hash of words ``i .. i+n-1``; returns how many there are."""
    top = ONE  # B**(n-1)
    for _ in range(n - 1):
        top *= WORD_BASE
    rolling = ZERO
    for i in range(words):
        if i >= n:
            rolling -= word_hash[i - n] * top
        rolling = rolling * WORD_BASE + word_hash[i]
        if i >= n - 1:
            grams[i - n + 1] = _mix64(rolling)
    return max(words - n + 1, 0)


@numba.njit(cache=True, inline="always")
def _buffers(offsets):
    """Per-text scratch: lower-cased bytes (a character grows by a byte at most), run starts,
    ends and hashes, word hashes, n-gram hashes, the runs longer than eight bytes."""
    size = 1
    for t in range(len(offsets) - 1):
        size = max(size, offsets[t + 1] - offsets[t])
    words = size // 2 + 1
    return (
        np.empty(2 * size, np.uint8),
        np.empty(words, np.int64),
        np.empty(words, np.int64),
        np.empty(words, np.uint64),
        np.empty(words, np.uint64),
        np.empty(words, np.uint64),
        np.empty(words, np.int64),
    )


@numba.njit(cache=True, inline="always")
def _eight_bytes(view, at):
    """``data[at:at + 8]`` as a little-endian uint64, zeros past the end of ``data``
    (``view[i]`` is ``data[i:i+8]``): past the last full eight, the last eight shifted down.
    No branch, so LLVM vectorises the loops that call it."""
    last = len(view) - 1
    return view[min(at, last)] >> np.uint64(8 * (at - min(at, last)))


@numba.njit(cache=True, inline="always")
def _ascii_hashes(view, runs, run_start, run_end, out, longer):
    """``_word_hash`` of each run read straight from the batch: an ASCII word's bytes are letters
    and digits, and setting bit 5 of each lower-cases the letters and keeps the digits. The
    first eight bytes of all of them in one loop (vectorised), noting the longer ones in
    ``longer`` without a branch; then the rest of those (a tenth of the words: a second loop
    over all of them mispredicted at each)."""
    count = 0
    for w in range(runs):
        length = run_end[w] - run_start[w]
        chunk = (_eight_bytes(view, run_start[w]) | CASE_BIT) & BYTE_MASKS[min(length, 8)]
        out[w] = _mix64(chunk ^ (np.uint64(length) * GOLDEN))
        longer[count] = w
        count += length > 8
    for k in range(count):
        w = longer[k]
        h, at = out[w], run_start[w] + 8
        while at < run_end[w]:
            h = _mix64(h ^ ((_eight_bytes(view, at) | CASE_BIT) & BYTE_MASKS[min(run_end[w] - at, 8)]))
            at += 8
        out[w] = h


@numba.njit(cache=True, inline="always")
def _text_words(data, view, word_bits, high_bits, ascii_, t, offsets, table, lower, scratch):
    """Text ``t``'s word hashes, in ``word_hash``; returns how many. Its runs of ASCII letters,
    digits and (in a text that has them) non-ASCII bytes come from the bitmaps and are hashed as
    ASCII words; a run with a non-ASCII byte is lower-cased by the code-point table instead,
    which also splits it where a character is no letter or digit. ``scratch``: ``_buffers``."""
    lowered, run_start, run_end, run_hash, word_hash, _, longer = scratch
    first, stop = offsets[t], offsets[t + 1]
    if stop == first:
        return 0
    runs = set_runs(word_bits, high_bits, not ascii_[t], first, stop, run_start, run_end)
    if ascii_[t]:
        _ascii_hashes(view, runs, run_start, run_end, word_hash, longer)
        return runs
    _ascii_hashes(view, runs, run_start, run_end, run_hash, longer)
    words = 0
    for r in range(runs):
        if not any_set(high_bits, run_start[r], run_end[r]):
            word_hash[words] = run_hash[r]
            words += 1
            continue
        length = _lower_text(data, run_start[r], run_end[r], table, lower, lowered)
        at = 0
        while at < length:
            if lowered[at] == 0:
                at += 1
                continue
            begin = at
            while at < length and lowered[at] != 0:
                at += 1
            word_hash[words] = _word_hash(lowered, begin, at)
            words += 1
    return words


@numba.njit(cache=True)
def ngram_hashes(data, view, word_bits, high_bits, ascii_, offsets, n, table, lower):
    """``(hashes, text of each, words per text)`` of every n-gram inside one text (to build a set)."""
    texts = len(offsets) - 1
    scratch = _buffers(offsets)
    word_hash, grams = scratch[4], scratch[5]
    words_per_text = np.zeros(texts, np.int64)
    capacity = 1024
    out_hashes = np.empty(capacity, np.uint64)
    out_text = np.empty(capacity, np.int64)
    count = 0
    for t in range(texts):
        words = _text_words(data, view, word_bits, high_bits, ascii_, t, offsets, table, lower, scratch)
        total = _rolling_grams(word_hash, words, n, grams)
        words_per_text[t] = words
        if count + total > capacity:
            capacity = max(2 * capacity, count + total)
            more_hashes, more_text = np.empty(capacity, np.uint64), np.empty(capacity, np.int64)
            more_hashes[:count], more_text[:count] = out_hashes[:count], out_text[:count]
            out_hashes, out_text = more_hashes, more_text
        out_hashes[count : count + total] = grams[:total]
        out_text[count : count + total] = t
        count += total
    return out_hashes[:count].copy(), out_text[:count].copy(), words_per_text


@numba.njit(cache=True, inline="always")
def _filter_bits(gram):
    """The three bits ``gram`` sets in its word of the Bloom filter (6-bit fields of its low bits)."""
    return (ONE << (gram & LOW6)) | (ONE << ((gram >> SIX) & LOW6)) | (ONE << ((gram >> TWELVE) & LOW6))


@numba.njit(cache=True)
def bloom_filter(hashes, word_bits):
    """The blocked Bloom filter of ``hashes``: ``2**word_bits`` uint64 words, a hash's top
    ``word_bits`` bits choosing its word."""
    words = np.zeros(1 << word_bits, np.uint64)
    shift = np.uint64(64 - word_bits)
    for h in hashes:
        words[h >> shift] |= _filter_bits(h)
    return words


@numba.njit(cache=True, inline="always")
def _may_hold(gram, words, words_shift):
    """Whether the Bloom filter ``words`` may hold ``gram`` (all its bits are set)."""
    bits = _filter_bits(gram)
    return (words[gram >> words_shift] & bits) == bits


@numba.njit(cache=True)
def find_ngrams(
    data,
    view,
    word_bits,
    high_bits,
    ascii_,
    skip,
    offsets,
    n,
    table,
    lower,
    filter_words,
    filter_shift,
    buckets,
    shift,
    fingerprints,
    capacity,
):
    """The n-grams of a batch that are in the set: ``(count, text, first word, index in the
    set)`` of each; ``count`` may exceed ``capacity``, and then only the first ``capacity`` are
    filled (the caller calls again with room for all). Texts with ``skip`` set are passed over.
    A text's n-grams read the set's Bloom filter in one loop of independent loads; the few
    that pass read their bucket bounds in a second and compare the bucket's fingerprints in a
    third (a load that misses the cache waits for no other)."""
    scratch = _buffers(offsets)
    word_hash, grams = scratch[4], scratch[5]
    passed = np.empty(len(grams), np.int64)
    low, high = np.empty(len(grams), np.int64), np.empty(len(grams), np.int64)
    hit_text = np.empty(capacity, np.int64)
    hit_word = np.empty(capacity, np.int64)
    hit_at = np.empty(capacity, np.int64)
    count = 0
    for t in range(len(offsets) - 1):
        if skip[t]:
            continue
        words = _text_words(data, view, word_bits, high_bits, ascii_, t, offsets, table, lower, scratch)
        total = _rolling_grams(word_hash, words, n, grams)
        kept = 0
        for i in range(total):  # no branch: the loads of the filter overlap
            passed[kept] = i
            kept += _may_hold(grams[i], filter_words, filter_shift)
        for k in range(kept):  # the bucket bounds of all of them, as independent loads
            bucket = grams[passed[k]] >> shift
            low[k], high[k] = buckets[bucket], buckets[bucket + 1]
        for k in range(kept):
            at = _in_bucket(grams[passed[k]], fingerprints, low[k], high[k])
            if at >= 0:
                if count < capacity:
                    hit_text[count], hit_word[count], hit_at[count] = t, passed[k], at
                count += 1
    return count, hit_text, hit_word, hit_at


@numba.njit(cache=True)
def may_hold(grams, filter_words, filter_shift):
    """Per hash: whether the Bloom filter may hold it."""
    out = np.empty(len(grams), np.bool_)
    for i in range(len(grams)):
        out[i] = _may_hold(grams[i], filter_words, filter_shift)
    return out


@numba.njit(cache=True)
def text_words(data, start, stop, table, lower):
    """``(lower-cased bytes, word starts, word ends)`` of one text (to spell a match out)."""
    lowered, word_start, word_end, word_hash, _, _, _ = _buffers(np.array([start, stop]))
    length = _lower_text(data, start, stop, table, lower, lowered)
    words = _words(lowered, length, word_hash, word_start, word_end)
    return lowered[:length].copy(), word_start[:words].copy(), word_end[:words].copy()


@numba.njit(cache=True)
def grams_in_set(word_hashes, n, filter_words, filter_shift, buckets, shift, fingerprints):
    """Per n-gram of one text's word hashes: whether it is in the set."""
    grams = np.empty(len(word_hashes) + 1, np.uint64)
    total = _rolling_grams(word_hashes, len(word_hashes), n, grams)
    hit = np.zeros(total, np.bool_)
    for i in range(total):
        hit[i] = (
            _may_hold(grams[i], filter_words, filter_shift)
            and _find(grams[i], buckets, shift, fingerprints) >= 0
        )
    return hit
