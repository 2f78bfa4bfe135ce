"""A batch's bytes as bitmaps, 64 bytes to a ``uint64``: which bytes are ASCII letters or
digits (word bytes), digits, non-ASCII, and events (the bytes a PII detector starts from).

Why bitmaps: a compiled loop that branches on every byte (is it in a word?) mispredicts at
every word edge, and most of its time went there (about 2 ns a byte on the benchmark machine).
Here one loop classifies the bytes with byte arithmetic only, which LLVM turns into SIMD
(about 0.1 ns a byte), a second packs the classes into bitmaps, and the passes over words,
digit runs and events walk the set bits of ``x ^ (x << 1)`` with ``trailing_zeros``: a few
instructions per word edge, none per byte.

Events: ``@`` (e-mail), ``:`` and ``=`` after a letter, digit, ``_.-``, space or quote (a value
assigned to a secret-like name, IPv6: most ``:`` and ``=`` of code, after ``)`` ``]`` ``=``, are
none), and the
two-byte starts of credentials with a known prefix (``gh``/``gi``, ``xo``, ``sk``, ``AK``/``AS``/
``AB``/``AC``/``AI``, ``BE`` of ``-----BEGIN``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

U8 = np.uint8
ONE, ZERO = np.uint64(1), np.uint64(0)
BLOCK_SHIFT, BLOCK_LOW = 6, 63


@numba.njit(cache=True, inline="always")
def _class(w, x, y):
    """The class bits of byte ``x``, after byte ``w`` and before byte ``y``."""
    digit = U8(x - U8(48)) < U8(10)
    letter = U8((x | U8(32)) - U8(97)) < U8(26)
    name_end = (  # what a secret-like name may end with, a space or a quote (see pii_scan)
        (U8(w - U8(48)) < U8(10))
        | (U8((w | U8(32)) - U8(97)) < U8(26))
        | (w == U8(95)) | (w == U8(46)) | (w == U8(45))
        | (w == U8(32)) | (U8(w - U8(9)) < U8(5)) | (w == U8(34)) | (w == U8(39))
        | (U8(w - U8(28)) < U8(4)) | (w >= U8(128))  # what else Python's \s may be made of
    )  # fmt: skip
    mark = (x == U8(64)) | (((x == U8(58)) | (x == U8(61))) & name_end)  # @, and : = after a name
    lead = (
        ((x == U8(103)) & ((y == U8(104)) | (y == U8(105))))  # gh, gi
        | ((x == U8(120)) & (y == U8(111)))  # xo
        | ((x == U8(115)) & (y == U8(107)))  # sk
        | ((x == U8(65)) & ((y == U8(75)) | (y == U8(83)) | (y == U8(66)) | (y == U8(67)) | (y == U8(73))))
        | ((x == U8(66)) & (y == U8(69)))  # BE
    )
    return U8(digit) | (U8(letter) << U8(1)) | (U8(mark | lead) << U8(2)) | (x & U8(0x80))


@numba.njit(cache=True)
def _classes(data, out):
    """``out[i]``: the class bits of ``data[i]`` (``out`` is padded to a multiple of 64 with 0)."""
    n = len(data)
    if n:
        out[0] = _class(U8(0), data[0], data[1] if n > 1 else U8(0))
    for i in range(1, n - 1):
        out[i] = _class(data[i - 1], data[i], data[i + 1])
    if n > 1:
        out[n - 1] = _class(data[n - 2], data[n - 1], U8(0))


LOW_BITS = np.uint64(0x0101010101010101)
GATHER = np.uint64(0x0102040810204080)  # bit 8i (i < 8) of x lands on bit 56 + i of x * GATHER
S56, S63 = np.uint64(56), np.uint64(63)


@numba.njit(cache=True, inline="always")
def _gather(x):
    """The low bits of the 8 bytes of ``x`` as one byte."""
    return ((x & LOW_BITS) * GATHER) >> S56


@numba.njit(cache=True)
def _pack(classes, words, digits, events, high):
    """Per 64 bytes, a bit per byte of each class (the classes read 8 bytes at a time)."""
    eights = classes.view(np.uint64)
    for j in range(len(words)):
        w = d = e = h = ZERO
        for k in range(8):
            c = eights[8 * j + k]
            shift = np.uint64(8 * k)
            w |= _gather(c | (c >> ONE)) << shift
            d |= _gather(c) << shift
            e |= _gather(c >> np.uint64(2)) << shift
            h |= _gather(c >> np.uint64(7)) << shift
        words[j], digits[j], events[j], high[j] = w, d, e, h


@dataclass(frozen=True)
class Bitmaps:
    """Bit ``i & 63`` of word ``i >> 6`` says whether byte ``i`` of the batch is of the class."""

    words: np.ndarray
    digits: np.ndarray
    events: np.ndarray
    high: np.ndarray


def bitmaps(data: np.ndarray) -> Bitmaps:
    """The bitmaps of ``data``; a class byte is bit 0 digit, 1 letter, 2 event, 7 non-ASCII."""
    blocks = (len(data) + 63) // 64
    classes = np.empty(blocks * 64, np.uint8)
    classes[len(data) :] = 0
    _classes(data, classes)
    out = Bitmaps(*(np.empty(blocks, np.uint64) for _ in range(4)))
    _pack(classes, out.words, out.digits, out.events, out.high)
    return out


@numba.njit(cache=True, inline="always")
def block_of(bitmap, j, first, stop):
    """Word ``j`` of ``bitmap`` with the bits of bytes outside ``[first, stop)`` cleared."""
    x = bitmap[j]
    base = j << BLOCK_SHIFT
    if first > base:
        x &= ~((ONE << np.uint64(first - base)) - ONE)
    if stop < base + 64:
        x &= (ONE << np.uint64(stop - base)) - ONE
    return x


@numba.njit(cache=True, inline="always")
def set_runs(bitmap, extra, with_extra, first, stop, starts, ends):
    """The maximal runs of set bits of ``bitmap`` (or'ed with ``extra`` when ``with_extra``)
    over bytes ``[first, stop)``, into ``starts``/``ends``; returns how many. The edges are the
    set bits of ``x ^ (x << 1)``, walked with ``trailing_zeros``: a few instructions per edge."""
    runs = 0
    inside = False
    carry = ZERO
    for j in range(first >> BLOCK_SHIFT, ((stop - 1) >> BLOCK_SHIFT) + 1):
        x = block_of(bitmap, j, first, stop)
        if with_extra:
            x |= block_of(extra, j, first, stop)
        edges = x ^ ((x << ONE) | carry)
        carry = x >> S63
        base = j << BLOCK_SHIFT
        while edges:
            at = base + trailing_zeros(edges)
            edges &= edges - ONE
            if inside:
                ends[runs] = at
                runs += 1
            else:
                starts[runs] = at
            inside = not inside
    if inside:
        ends[runs] = stop
        runs += 1
    return runs


def any_high(maps: Bitmaps, offsets: np.ndarray) -> np.ndarray:
    """Per text: whether it holds a non-ASCII byte."""
    return _any_high(maps.high, offsets)


@numba.njit(cache=True, inline="always")
def any_set(bitmap, first, stop):
    """Whether any byte of ``[first, stop)`` (not empty) has its bit set."""
    for j in range(first >> BLOCK_SHIFT, ((stop - 1) >> BLOCK_SHIFT) + 1):
        if block_of(bitmap, j, first, stop):
            return True
    return False


@numba.njit(cache=True)
def _any_high(high, offsets):
    out = np.zeros(len(offsets) - 1, np.bool_)
    for t in range(len(offsets) - 1):
        out[t] = offsets[t + 1] > offsets[t] and any_set(high, offsets[t], offsets[t + 1])
    return out
