"""The PII prefilter, compiled: where in a batch each type may occur, from the batch's bitmaps.

Every condition here is one that the type's Python pattern in :mod:`tasks.safety.pii` implies
(or, for the hits that pattern then searches around, one the Hyperscan prefilter this replaces
implied), so nothing the patterns would find is passed over; the patterns and checks then run on
the windows around these hits only. Most of a batch is never looked at here: a card number,
an IPv4 address or a phone number is a chain of digit runs (from the digit bitmap), and the
other types start at an event byte (``@``, ``:``, ``=``, or the two-byte start of a prefix).

Hits: ``(type, text, start, stop)`` in bytes of the batch; a type's index is its place in
:data:`tasks.safety.pii.DETECTORS` (the constants below follow that order), or ``IPV4_EXACT`` /
``EMAIL_EXACT`` for a hit whose span is already the pattern's match.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from tasks.safety.bitmaps import BLOCK_SHIFT, block_of, set_runs

PRIVATE_KEY, AWS_KEY, TOKEN, SECRET, EMAIL, CARD_NUMBER, IP_ADDRESS, PHONE = range(8)
IPV4_EXACT, EMAIL_EXACT = 8, 9
"""Hits whose span is the pattern's match (an IPv4 address with ASCII bytes around it: all its
check but the look at the words before, a version string; an e-mail address: all but the
allowed domains), so no window is searched for them."""
ONE, ZERO = np.uint64(1), np.uint64(0)
SECRET_LOOKBACK = 256  # bytes from a name's start to its "=" (longer ones are not looked for)
NAMES = (
    "password", "passwd", "pwd", "secret", "token", "apikey", "api_key", "api-key",
    "accesskey", "access_key", "access-key", "authkey", "auth_key", "auth-key",
    "privatekey", "private_key", "private-key", "credential",
)  # fmt: skip
"""What ``tasks.safety.pii.SECRET_NAME`` matches, as plain lower-case strings (``client_secret``
and ``credentials`` hold ``secret`` and ``credential``)."""
NAME_BYTES = np.zeros((len(NAMES), max(map(len, NAMES))), np.uint8)
NAME_LENGTHS = np.array([len(n) for n in NAMES], np.int64)
for _row, _name in enumerate(NAMES):
    NAME_BYTES[_row, : len(_name)] = np.frombuffer(_name.encode(), np.uint8)


def _byte_classes() -> np.ndarray:
    """Per byte, the classes it is in (bit flags): one load where a chain of compares would
    mispredict on code's many ``=`` and ``:``."""
    classes = np.zeros(256, np.uint8)
    for b in range(256):
        ch = chr(b)
        alnum = ch.isascii() and ch.isalnum()
        space = b == 32 or 9 <= b <= 13
        classes[b] = (
            (NAME if alnum or ch in "_.-" else 0)
            | (VALUE if alnum or ch in "+/=_-" else 0)
            | (MAYBE_SPACE if space or 28 <= b <= 31 or b >= 128 else 0)
            | (SPACE if space else 0)
            | (LOCAL if alnum or ch in "._%+-" else 0)
        )
    return classes


NAME, VALUE, MAYBE_SPACE, SPACE, LOCAL = 1, 2, 4, 8, 16
"""``[A-Za-z0-9_.-]`` (a secret-like name's bytes), ``[A-Za-z0-9+/=_-]`` (a bare value's),
a byte that may be (part of) what Python's ``\\s`` matches (an ASCII space, ``\\x1c`` to
``\\x1f``, or a byte of a character that is not ASCII: NBSP, U+3000, ...), an ASCII space, an
e-mail local part's ``[A-Za-z0-9._%+-]``."""
BYTE_CLASSES = _byte_classes()


@numba.njit(cache=True)
def _byte(data, at):
    return data[at] if 0 <= at < len(data) else np.uint8(0)


@numba.njit(cache=True)
def _is_digit(b):
    return 48 <= b <= 57


@numba.njit(cache=True)
def _is_alnum(b):
    return _is_digit(b) or 65 <= b <= 90 or 97 <= b <= 122


@numba.njit(cache=True)
def _is_hex(b):
    return _is_digit(b) or 65 <= b <= 70 or 97 <= b <= 102


@numba.njit(cache=True)
def _run_of(data, at, stop, kind):
    """How many bytes from ``at`` (before ``stop``) are of ``kind``: 0 upper-case letters or
    digits, 1 letters or digits, 2 letters, digits or ``_``, 3 letters, digits or ``-``,
    4 letters, digits, ``_`` or ``-``."""
    count = 0
    while at + count < stop:
        b = data[at + count]
        if kind == 0:
            ok = _is_digit(b) or 65 <= b <= 90
        else:
            ok = _is_alnum(b) or (kind in (2, 4) and b == 95) or (kind in (3, 4) and b == 45)
        if not ok:
            break
        count += 1
    return count


@numba.njit(cache=True)
def _starts_with(data, at, stop, literal):
    if at + len(literal) > stop:
        return False
    k = 0
    while k < len(literal) and data[at + k] == literal[k]:
        k += 1
    return k == len(literal)


@numba.njit(cache=True)
def _push(hits, count, kind, text, start, stop):
    """Write row ``count`` of ``hits`` when there is room; returns the new count."""
    if count < len(hits):
        hits[count, 0], hits[count, 1], hits[count, 2], hits[count, 3] = kind, text, start, stop
    return count + 1


@numba.njit(cache=True)
def _prefixed(data, at, stop, literals):
    """The end of a credential with a known prefix starting at ``at``, or -1."""
    b0, b1 = data[at], _byte(data, at + 1)
    if b0 == 65:  # A
        if b1 == 73:  # AIza + 35 of [0-9A-Za-z_-]
            if _starts_with(data, at, stop, literals[0]) and _run_of(data, at + 4, stop, 4) >= 35:
                return TOKEN, at + 39
            return -1, -1
        for k in range(1, 5):  # AKIA ASIA ABIA ACCA + 16 of [A-Z0-9]
            if _starts_with(data, at, stop, literals[k]):
                return (AWS_KEY, at + 20) if _run_of(data, at + 4, stop, 0) >= 16 else (-1, -1)
        return -1, -1
    if b0 == 103:  # gh[pousr]_ + 36 alnum, github_pat_ + 22 of [A-Za-z0-9_]
        b2, b3 = _byte(data, at + 2), _byte(data, at + 3)
        if b1 == 104 and b2 in (112, 111, 117, 115, 114) and b3 == 95:
            return (TOKEN, at + 40) if _run_of(data, at + 4, stop, 1) >= 36 else (-1, -1)
        if _starts_with(data, at, stop, literals[5]):
            return (TOKEN, at + 33) if _run_of(data, at + 11, stop, 2) >= 22 else (-1, -1)
        return -1, -1
    if b0 == 120:  # xox[abprs]- + 10 of [A-Za-z0-9-]
        b2, b3, b4 = _byte(data, at + 2), _byte(data, at + 3), _byte(data, at + 4)
        if b1 == 111 and b2 == 120 and b3 in (97, 98, 112, 114, 115) and b4 == 45:
            return (TOKEN, at + 15) if _run_of(data, at + 5, stop, 3) >= 10 else (-1, -1)
        return -1, -1
    if b0 == 115:  # sk- + 20 of [A-Za-z0-9_-], sk_live_ / sk_test_ + 16 alnum
        b2 = _byte(data, at + 2)
        if b2 == 45:
            return (TOKEN, at + 23) if _run_of(data, at + 3, stop, 4) >= 20 else (-1, -1)
        if _starts_with(data, at, stop, literals[6]) or _starts_with(data, at, stop, literals[7]):
            return (TOKEN, at + 24) if _run_of(data, at + 8, stop, 1) >= 16 else (-1, -1)
        return -1, -1
    if b0 == 66 and _byte(data, at - 1) == 45:  # -----BEGIN [A-Z ]*PRIVATE KEY-----
        if at - 5 < 0 or not _starts_with(data, at - 5, stop, literals[8]):
            return -1, -1
        if not _starts_with(data, at, stop, literals[11]):
            return -1, -1
        end = at + 6
        while end < stop and (65 <= data[end] <= 90 or data[end] == 32):
            end += 1
        ends_key = end - 11 >= at + 6 and _starts_with(data, end - 11, stop, literals[9])
        if ends_key and _starts_with(data, end, stop, literals[10]):
            return PRIVATE_KEY, end + 5
    return -1, -1


@numba.njit(cache=True, inline="always")
def _name_byte_before(data, first, sep):
    """Whether a byte a secret-like name may end with (``[A-Za-z0-9_.-]``) comes before ``sep``,
    past spaces and a quote: what the secret pattern needs there, and most ``:`` and ``=`` of
    code lack (``):``, ``==``, ``] =``)."""
    at = sep - 1
    while at >= first and BYTE_CLASSES[data[at]] & MAYBE_SPACE:
        at -= 1
    if at >= first and (data[at] == 34 or data[at] == 39):
        at -= 1
    return at >= first and BYTE_CLASSES[data[at]] & NAME != 0


@numba.njit(cache=True)
def _secret_name_before(data, first, sep, names, lengths):
    """Where the first secret-like name (any case) starts in the run of ``[A-Za-z0-9_.-]``
    before ``sep`` (past spaces and a quote), else -1: where the secret pattern's match for
    this ``sep`` starts, if it has one."""
    at = sep - 1
    while at >= first and BYTE_CLASSES[data[at]] & MAYBE_SPACE:
        at -= 1
    if at >= first and (data[at] == 34 or data[at] == 39):
        at -= 1
    end = at + 1
    low = max(first, sep - SECRET_LOOKBACK)
    while at >= low and BYTE_CLASSES[data[at]] & NAME:
        at -= 1
    start = at + 1
    for i in range(start, end):
        for n in range(len(lengths)):
            length = lengths[n]
            if i + length > end:
                continue
            same = True
            for k in range(length):
                b = data[i + k]
                if 65 <= b <= 90:
                    b += 32
                if b != names[n, k]:
                    same = False
                    break
            if same:
                return i
    return -1


@numba.njit(cache=True)
def _secret_value_after(data, at, stop, min_chars):
    """Whether a value the secret pattern takes follows ``at``: spaces, then a quoted run of at
    least ``min_chars`` bytes without quotes or spaces, or 16 bare ``[A-Za-z0-9+/=_-]``."""
    while at < stop and BYTE_CLASSES[data[at]] & MAYBE_SPACE:
        at += 1
    if at >= stop:
        return False
    quote = data[at]
    if quote == 34 or quote == 39:
        end = at + 1
        while end < stop and data[end] != 34 and data[end] != 39 and not BYTE_CLASSES[data[end]] & SPACE:
            end += 1
        return end < stop and data[end] == quote and end - at - 1 >= min_chars
    if at + 16 > stop:
        return False
    every = VALUE
    for k in range(16):  # all sixteen, without a branch: most values end within a few bytes
        every &= BYTE_CLASSES[data[at + k]]
    return every != 0


@numba.njit(cache=True, inline="always")
def _ipv6_lead(data, colon, first, stop):
    """Whether the colon at ``colon`` follows a hex digit and comes before one or a colon: every
    address the IPv6 pattern and check accept has such a colon (after its first group)."""
    return (
        colon > first
        and colon + 1 < stop
        and _is_hex(data[colon - 1])
        and (_is_hex(data[colon + 1]) or data[colon + 1] == 58)
    )


@numba.njit(cache=True)
def _ipv6_run(data, colon, first, stop):
    """``(start, stop)`` of the run of hex digits and colons holding the colon at ``colon`` when
    the IPv6 pattern and check may accept it, else ``(-1, -1)``; only its first colon that
    :func:`_ipv6_lead` accepts reports it. The pattern's match is the whole run (nothing of ``[\\w.:]`` before it, no word byte
    after it, 2 to 7 colons, groups of at most 4); the check wants a digit, one ``::`` at most
    (not at a single colon's place), and 8 groups without it, 3 to 7 with it (the loopback and
    unspecified addresses are left to it)."""
    start = colon
    while start > first and (_is_hex(data[start - 1]) or data[start - 1] == 58):
        start -= 1
    for k in range(start, colon):
        if data[k] == 58 and _ipv6_lead(data, k, first, stop):
            return -1, -1  # an earlier colon of the run reports it
    end = colon + 1
    while end < stop and (_is_hex(data[end]) or data[end] == 58):
        end += 1
    if start > first and (_is_alnum(data[start - 1]) or data[start - 1] in (95, 46)):
        return -1, -1
    if end < stop and (_is_alnum(data[end]) or data[end] == 95):
        return -1, -1
    groups, colons, doubles, size = 0, 0, 0, 0
    digit = False
    for k in range(start, end):
        b = data[k]
        if b == 58:
            colons += 1
            doubles += k + 1 < end and data[k + 1] == 58
            size = 0
        else:
            groups += size == 0
            size += 1
            digit = digit or _is_digit(b)
            if size > 4:
                return -1, -1
    if not digit or colons > 7 or doubles > 1:
        return -1, -1
    single_edge = (data[start] == 58 and data[start + 1] != 58) or (
        data[end - 1] == 58 and data[end - 2] != 58
    )
    if single_edge or (not 3 <= groups <= 7 if doubles else groups != 8):
        return -1, -1
    return start, end


@numba.njit(cache=True)
def _email_around(data, at, first, stop):
    """``(start, stop)`` of the run of local-part bytes before the ``@`` at ``at`` and of domain
    bytes after it, when ``[A-Za-z0-9._%+-]@[A-Za-z0-9-]+\\.`` matches there (the prefilter this
    replaces), else ``(-1, -1)``: an address the pattern finds lies inside (its local part
    starts where such a run does, its domain is such bytes)."""
    if at - 1 < first or not BYTE_CLASSES[data[at - 1]] & LOCAL:
        return -1, -1
    label = at + 1
    while label < stop and (_is_alnum(data[label]) or data[label] == 45):
        label += 1
    if label == at + 1 or label >= stop or data[label] != 46:
        return -1, -1
    start = at - 1
    while start > first and BYTE_CLASSES[data[start - 1]] & LOCAL:
        start -= 1
    end = label
    while end < stop and (_is_alnum(data[end]) or data[end] == 45 or data[end] == 46):
        end += 1
    return start, end


@numba.njit(cache=True)
def _email_match(data, at, start, end, first, stop):
    """``(EMAIL_EXACT, where the pattern's match ends)`` for the address around the ``@`` at
    ``at`` (``start .. end``: its local-part and domain runs, from :func:`_email_around`),
    ``(-1, -1)`` when the pattern has no match there, or ``(EMAIL, end)`` when its window is to
    be searched: a run that may hold another address's domain (an ``@`` just before or after it,
    so one search through the text may have taken those bytes already), or a ``\\b`` that
    reads a character that is not ASCII.

    The match: a local part of 1 to 64 bytes (the whole run: the look-behind forbids starting
    inside it), labels of 1 to 63 bytes, each before a ``.``, as many as the pattern can take,
    then a top-level domain: the letters that start the next part, 2 to 24 of them, before no
    word character."""
    if at - start > 64:
        return -1, -1
    after = end
    while after < stop and BYTE_CLASSES[data[after]] & LOCAL:
        after += 1
    if (start > first and data[start - 1] == 64) or (after < stop and data[after] == 64):
        return EMAIL, end
    result, part, labels_ok = -1, at + 1, True
    while labels_ok and part < end:
        dot = part
        while dot < end and data[dot] != 46:
            dot += 1
        if part > at + 1:  # a top-level domain here, after the labels before it
            letters = part
            while letters < end and (65 <= data[letters] <= 90 or 97 <= data[letters] <= 122):
                letters += 1
            if 2 <= letters - part <= 24:
                if letters < end:  # "-" or "." ends it; a digit is a word character
                    bounded = data[letters] == 45 or data[letters] == 46
                elif end == stop or data[end] < 128:
                    bounded = end == stop or not (_is_alnum(data[end]) or data[end] == 95)
                else:
                    return EMAIL, end
                if bounded:
                    result = letters
        labels_ok = 1 <= dot - part <= 63 and dot < end
        part = dot + 1
    return (EMAIL_EXACT, result) if result >= 0 else (-1, -1)


@numba.njit(cache=True)
def _gap_is(data, a, b, c0, c1, c2, c3):
    """Whether every byte of ``data[a:b]`` (at least one) is one of the four."""
    if b <= a:
        return False
    for k in range(a, b):
        x = data[k]
        if x != c0 and x != c1 and x != c2 and x != c3:
            return False
    return True


@numba.njit(cache=True)
def _octet(data, start, end):
    """The value of the digits ``data[start:end]`` (1 to 3 of them), or -1 with a leading zero."""
    if end - start > 1 and data[start] == 48:
        return -1
    value = 0
    for k in range(start, end):
        value = value * 10 + data[k] - 48
    return value


@numba.njit(cache=True)
def _ipv4_at(data, first, stop, starts, ends, r):
    """Whether digit runs ``r .. r + 3`` are an address the IPv4 pattern and check accept (all
    but the check's look at the words before): four runs of 1 to 3 digits one ``.`` apart,
    nothing of ``[\\w.:]`` before (a non-ASCII byte may be a letter: it is let through), no word
    byte or ``.`` and a word byte after, octets of at most 255 without a leading zero, and not
    0.0.0.0, 127.0.0.1 or 255.255.255.255."""
    for k in range(4):
        if ends[r + k] - starts[r + k] > 3:
            return False
        if k < 3 and (starts[r + k + 1] - ends[r + k] != 1 or data[ends[r + k]] != 46):
            return False
    before = _byte(data, starts[r] - 1) if starts[r] > first else np.uint8(32)
    if _is_alnum(before) or before in (95, 46, 58):
        return False
    end = ends[r + 3]
    after = data[end] if end < stop else np.uint8(32)
    if _is_alnum(after) or after == 95:
        return False
    if after == 46 and end + 1 < stop and (_is_alnum(data[end + 1]) or data[end + 1] == 95):
        return False
    a, b = _octet(data, starts[r], ends[r]), _octet(data, starts[r + 1], ends[r + 1])
    c, d = _octet(data, starts[r + 2], ends[r + 2]), _octet(data, starts[r + 3], ends[r + 3])
    if min(a, b, c, d) < 0 or max(a, b, c, d) > 255:
        return False
    if a == b == c == d and (a == 0 or a == 255):
        return False
    return not (a == 127 and b == 0 and c == 0 and d == 1)


@numba.njit(cache=True, inline="always")
def _ascii_around(data, first, stop, start, end):
    """Whether the byte before ``start .. end`` and the two after it (those the IPv4 pattern's
    look-behind and look-ahead read) are ASCII, or the text's edge: Python's ``\\w`` is then
    ASCII's."""
    return (
        (start == first or data[start - 1] < 128)
        and (end >= stop or data[end] < 128)
        and (end + 1 >= stop or data[end + 1] < 128)
    )


@numba.njit(cache=True, inline="always")
def _wide_near(data, first, stop, start, end):
    """Whether a byte of a character that is not ASCII lies within two bytes of ``start .. end``
    (a digit Python's ``\\d`` takes may extend the chain there)."""
    before = (start - 1 >= first and data[start - 1] >= 128) or (
        start - 2 >= first and data[start - 2] >= 128
    )
    return before or (end < stop and data[end] >= 128) or (end + 1 < stop and data[end + 1] >= 128)


@numba.njit(cache=True)
def _card_in(data, first, stop, starts, ends, r, last):
    """Whether a card number the pattern and check accept may lie in the chain of digit runs
    ``r .. last``: it runs from a run not after ``.`` or ``-`` to a run not before ``-``, holds
    13 to 19 digits, starts with an issuer's prefix, not one digit repeated, and passes Luhn."""
    for i in range(r, last + 1):
        before = data[starts[i] - 1] if starts[i] > first else np.uint8(32)
        if before == 46 or before == 45:
            continue
        digits = 0
        for j in range(i, last + 1):
            digits += ends[j] - starts[j]
            if digits > 19:
                break
            after = data[ends[j]] if ends[j] < stop else np.uint8(32)
            if digits >= 13 and after != 45 and _card_number_ok(data, starts, ends, i, j, digits):
                return True
    return False


@numba.njit(cache=True)
def _card_number_ok(data, starts, ends, i, j, digits):
    """The check of the card number made of the digits of runs ``i .. j`` (``digits`` of them):
    an issuer's prefix (4, 51-55, 22-27, 34, 37, 30, 35, 36, 38, 39, 6011, 65, 644-649), not
    one digit repeated, and Luhn."""
    number = np.empty(digits, np.uint8)
    at = 0
    for k in range(i, j + 1):
        for b in range(starts[k], ends[k]):
            number[at] = data[b] - 48
            at += 1
    d0, d1 = number[0], number[1]
    two = d0 * 10 + d1
    prefix = (
        d0 == 4
        or 51 <= two <= 55
        or 22 <= two <= 27
        or two in (34, 37, 30, 35, 36, 38, 39, 65)
        or (two == 60 and number[2] == 1 and number[3] == 1)
        or (two == 64 and number[2] >= 4)
    )
    if not prefix:
        return False
    repeated = True
    for k in range(digits):
        repeated = repeated and number[k] == d0
    if repeated:
        return False
    total = 0
    for k in range(digits):
        d = number[digits - 1 - k]
        if k % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


@numba.njit(cache=True)
def pii_hits(
    data, offsets, digit_bits, event_bits, active, min_secret_chars, literals, names, lengths, capacity
):
    """``(count, hits)``: every hit of the active types (``active[type]``) in the batch, as rows
    ``(type, text, start, stop)``; ``count`` may exceed ``capacity``, and then only the first
    ``capacity`` rows are filled (the caller calls again with room for all)."""
    hits = np.empty((capacity, 4), np.int64)
    count = 0
    size = 1
    for t in range(len(offsets) - 1):
        size = max(size, offsets[t + 1] - offsets[t])
    starts = np.empty(size // 2 + 1, np.int64)
    ends = np.empty(size // 2 + 1, np.int64)
    digits_wanted = active[CARD_NUMBER] or active[IP_ADDRESS] or active[PHONE]
    for t in range(len(offsets) - 1):
        first, stop = offsets[t], offsets[t + 1]
        if stop == first:
            continue
        for j in range(first >> BLOCK_SHIFT, ((stop - 1) >> BLOCK_SHIFT) + 1):
            events = block_of(event_bits, j, first, stop)
            base = j << BLOCK_SHIFT
            while events:
                at = base + trailing_zeros(events)
                events &= events - ONE
                b = data[at]
                if b == 64:  # @
                    if active[EMAIL]:
                        start, end = _email_around(data, at, first, stop)
                        if start >= 0:
                            kind, last = _email_match(data, at, start, end, first, stop)
                            if kind >= 0:
                                count = _push(hits, count, kind, t, start, last)
                elif b == 58 or b == 61:  # : =
                    if active[IP_ADDRESS] and b == 58 and _ipv6_lead(data, at, first, stop):
                        start, end = _ipv6_run(data, at, first, stop)
                        if start >= 0:
                            count = _push(hits, count, IP_ADDRESS, t, start, end)
                    if active[SECRET]:  # the value first: code's ``=`` and ``:`` mostly have a name before
                        nxt = _byte(data, at + 1)
                        two = (b == 58 and nxt == 61) or (b == 61 and nxt == 62)  # := =>
                        valued = _secret_value_after(data, at + 1, stop, min_secret_chars) or (
                            two and _secret_value_after(data, at + 2, stop, min_secret_chars)
                        )
                        if valued and _name_byte_before(data, first, at):
                            start = _secret_name_before(data, first, at, names, lengths)
                            if start >= 0:
                                count = _push(hits, count, SECRET, t, start, at + 1 + two)
                else:
                    kind, end = _prefixed(data, at, stop, literals)
                    if kind >= 0 and active[kind]:
                        start = at - 5 if kind == PRIVATE_KEY else at
                        count = _push(hits, count, kind, t, start, end)
        if not digits_wanted:
            continue
        runs = set_runs(digit_bits, digit_bits, False, first, stop, starts, ends)
        r = 0
        while r < runs:  # chains: digit runs one " " or "-" apart (a card number's digits)
            last, total = r, ends[r] - starts[r]
            while last + 1 < runs and starts[last + 1] - ends[last] == 1 and data[ends[last]] in (32, 45):
                last += 1
                total += ends[last] - starts[last]
            wide = _wide_near(data, first, stop, starts[r], ends[last])  # Python's \d has more digits
            if (
                active[CARD_NUMBER]
                and total >= 13
                and (wide or _card_in(data, first, stop, starts, ends, r, last))
            ):
                count = _push(hits, count, CARD_NUMBER, t, starts[r], ends[last])
            r = last + 1
        for r in range(runs):
            dotted = r + 3 < runs and starts[r + 1] - ends[r] == 1 and data[ends[r]] == 46
            if active[IP_ADDRESS] and dotted and _ipv4_at(data, first, stop, starts, ends, r):
                exact = _ascii_around(data, first, stop, starts[r], ends[r + 3])
                count = _push(hits, count, IPV4_EXACT if exact else IP_ADDRESS, t, starts[r], ends[r + 3])
            if active[PHONE] and r + 2 < runs:  # (\d{1,4}) or \d{2,4}, [ .)-]+\d{3,4}[ .-]\d{3,4}
                a, b_, c = r, r + 1, r + 2
                parenthesised = starts[a] > first and data[starts[a] - 1] == 40 and data[ends[a]] == 41
                if (
                    (ends[a] - starts[a] >= 2 or parenthesised)
                    and 3 <= ends[b_] - starts[b_] <= 4
                    and ends[c] - starts[c] >= 3
                    and starts[c] - ends[b_] == 1
                    and data[ends[b_]] in (32, 46, 45)
                    and _gap_is(data, ends[a], starts[b_], 32, 46, 41, 45)
                ):
                    start = max(starts[a], ends[a] - 4)
                    count = _push(hits, count, PHONE, t, start, min(ends[c], starts[c] + 4))
    return count, hits


@numba.njit(cache=True)
def char_reach(data, offsets, text, start, stop, before, after):
    """Per hit (``text``, bytes ``start .. stop`` of it): the byte ``before`` characters before
    its start and the byte ``after`` characters past its stop (within the text): the window a
    pattern runs on, in a text whose characters may take several bytes."""
    first_out = np.empty(len(text), np.int64)
    end_out = np.empty(len(text), np.int64)
    for k in range(len(text)):
        first, end = offsets[text[k]], offsets[text[k] + 1]
        at, chars = first + start[k], 0
        while at > first and chars < before:
            at -= 1
            chars += (data[at] & 0xC0) != 0x80
        while at > first and (data[at] & 0xC0) == 0x80:
            at -= 1
        first_out[k] = at - first
        at, chars = first + stop[k], 0
        while at < end and chars < after:
            at += 1
            while at < end and (data[at] & 0xC0) == 0x80:
                at += 1
            chars += 1
        end_out[k] = at - first
    return first_out, end_out


LITERALS = tuple(
    np.frombuffer(s.encode(), np.uint8)
    for s in (
        "AIza",
        "AKIA",
        "ASIA",
        "ABIA",
        "ACCA",
        "github_pat_",
        "sk_live_",
        "sk_test_",
        "-----",
        "PRIVATE KEY",
        "-----",
        "BEGIN ",
    )
)
"""The prefixes :func:`_prefixed` compares, by index."""
