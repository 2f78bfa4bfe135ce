"""Personal data and credentials in text: find them, replace each with a typed placeholder.

Each type is a detector: a prefilter (all types' at once, one compiled pass over the batch's
bitmaps, :mod:`tasks.safety.pii_scan`: most documents contain nothing, and leave here after
it), then a Python pattern and a check on the windows around that type's hits only (Luhn for
cards, octet ranges for IPv4, the socket module's parser for IPv6, Shannon entropy for values of
secret-like names).

Why not detect-secrets: its plugins scan line by line in Python, every plugin on every line;
``benchmarks/safety.py`` measures it on the same text, and it is too slow to run on every
document of a corpus (the figure is in docs/ingest_validate.md). These detectors cover its
plugins that fit prose and code (AWS, private keys, GitHub, Slack, OpenAI/Stripe-style
prefixed tokens, keyword + high-entropy values).

False positives kept out on purpose: version strings that look like IPv4 addresses
(``version 1.2.3.4``, ``v10.0.0.1``, four-part numbers inside longer dotted runs), addresses at
allowed domains (``example.com`` by default), hex and base64 digests in lock files (no
secret-like name, no known prefix), and test fixtures (placeholder values such as ``dummy``,
``changeme``, ``xxxx``, AWS's documented ``...EXAMPLE`` key).
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.safety import pii_scan
from tasks.safety.config import PiiConfig
from tasks.safety.words import BatchBytes, batch_bytes

PLACEHOLDERS = {
    "email": "<EMAIL>",
    "ip_address": "<IP_ADDRESS>",
    "phone": "<PHONE>",
    "card_number": "<CARD_NUMBER>",
    "aws_key": "<AWS_KEY>",
    "private_key": "<PRIVATE_KEY>",
    "token": "<TOKEN>",
    "secret": "<SECRET>",
}
VERSION_BEFORE = re.compile(
    r"(?:\bv|\bversion|\bver|\brelease|\brev|\bbuild|\bpython|\bnode)\s*[:=]?\s*$", re.I
)
PLACEHOLDER_VALUE = re.compile(
    r"example|dummy|fake|sample|placeholder|changeme|change_me|your[_-]|test|<|>|\$\{|\{\{|%s|\*\*\*|xxxx|1234|abcd",
    re.I,
)
SECRET_NAME = (
    r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|auth[_-]?key|"
    r"private[_-]?key|credentials?|client[_-]?secret)"
)


@dataclass(frozen=True)
class Detector:
    """One type: ``pattern`` (Python, near the prefilter's hits only, see
    :mod:`tasks.safety.pii_scan`), and ``span``: the part of a match that is redacted, or None
    when the check refuses it. ``reach``: how far a match may start before a prefilter hit and
    end after it (characters), so the Python pattern runs on those windows only; None: on the
    whole text."""

    kind: str
    pattern: re.Pattern[str]
    span: Callable[[re.Match[str], str, PiiConfig], tuple[int, int] | None]
    reach: tuple[int, int] | None = (64, 64)
    per_hit: bool = False  # the pattern is matched at each hit (the compiled pass found where), not searched


Check = Callable[[re.Match[str], str, PiiConfig], bool]


def whole(check: Check | None = None) -> Callable[[re.Match[str], str, PiiConfig], tuple[int, int] | None]:
    """The whole match, when ``check`` (if any) accepts it."""

    def span(match: re.Match[str], text: str, config: PiiConfig) -> tuple[int, int] | None:
        return match.span() if check is None or check(match, text, config) else None

    return span


def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


CARD_PREFIX = re.compile(r"^(?:4|5[1-5]|2[2-7]|3[47]|3[05689]|6(?:011|5|4[4-9]))")


def _card(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    digits = re.sub(r"[ -]", "", match.group())
    return (
        13 <= len(digits) <= 19 and bool(CARD_PREFIX.match(digits)) and len(set(digits)) > 1 and luhn(digits)
    )


def _ipv4(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    octets = match.group().split(".")
    if any(int(o) > 255 or (len(o) > 1 and o[0] == "0") for o in octets):
        return False
    if match.group() in ("0.0.0.0", "127.0.0.1", "255.255.255.255"):
        return False
    return not VERSION_BEFORE.search(text[max(0, match.start() - 16) : match.start()])


def _ipv6(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    candidate = match.group()
    groups = [g for g in candidate.split(":") if g]
    if len(groups) < (8 if "::" not in candidate else 3) or not any(c.isdigit() for c in candidate):
        return False
    packed = ipv6_packed(candidate)
    return packed is not None and packed not in (IPV6_LOOPBACK, IPV6_UNSPECIFIED)


IPV6_LOOPBACK, IPV6_UNSPECIFIED = bytes(15) + b"\x01", bytes(16)


def ipv6_packed(candidate: str) -> bytes | None:
    """The 16 bytes of an IPv6 address, or None if it is none. The C parser of the socket
    module: on the pattern's runs of hex digits and colons it accepts what ``ipaddress`` does
    (a test compares them), in 0.35 µs against ipaddress's 7 µs here (most of the IPv6 check's time)."""
    try:
        return socket.inet_pton(socket.AF_INET6, candidate)
    except OSError:
        return None


def _email(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    domain = match.group().rsplit("@", 1)[1].lower().rstrip(".")
    return not ("." + domain).endswith(_dotted(tuple(config.allow_email_domains)))


@functools.cache
def _dotted(domains: tuple[str, ...]) -> tuple[str, ...]:
    """``.example.com`` for ``example.com``: a domain and its subdomains end with it."""
    return tuple("." + d.lower().rstrip(".") for d in domains)


def _phone(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    digits = sum(c.isdigit() for c in match.group())
    return 9 <= digits <= 15


def _aws(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    return "EXAMPLE" not in match.group()


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(value)
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def _secret(match: re.Match[str], text: str, config: PiiConfig) -> tuple[int, int] | None:
    """The value of a secret-like name, when it is long and random enough and no placeholder
    (a bare, unquoted value needs half a bit more per character than a quoted one)."""
    quoted = match.group("value") is not None
    group = "value" if quoted else "bare"
    value = match.group(group)
    needed = config.min_secret_entropy + (0.0 if quoted else 0.5)
    if len(value) < config.min_secret_chars or PLACEHOLDER_VALUE.search(value) or entropy(value) < needed:
        return None
    return match.span(group)


def _ip(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    return _ipv6(match, text, config) if ":" in match.group() else _ipv4(match, text, config)


DETECTORS = (
    Detector(
        "private_key",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s:,-]*)",
            re.S,
        ),
        whole(),
        None,  # a key block runs to its END line, however long
    ),
    Detector(
        "aws_key",
        re.compile(r"(?<![A-Za-z0-9+/])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        whole(_aws),
        (8, 8),
    ),
    Detector(
        "token",
        re.compile(
            r"(?<![A-Za-z0-9+/_-])(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255}|"
            r"xox[abprs]-[A-Za-z0-9-]{10,255}|sk-(?:proj-)?[A-Za-z0-9_-]{20,255}|"
            r"sk_(?:live|test)_[A-Za-z0-9]{16,255}|AIza[0-9A-Za-z_-]{35})(?![A-Za-z0-9_-])"
        ),
        whole(),
        (8, 272),
    ),
    Detector(
        "secret",
        re.compile(
            r"(?i)" + SECRET_NAME + r"[a-z0-9_.-]*[\"']?\s*(?::=|=>|[:=])\s*"
            r"(?:(?P<quote>[\"'])(?P<value>[^\"'\s]{1,512})(?P=quote)|(?P<bare>[A-Za-z0-9+/=_-]{16,512})(?![\w(\[.]))"
        ),
        _secret,
        (0, 560),
        True,  # a value may take 560 characters: a search would go on over all of them
    ),
    Detector(
        "email",
        re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b"),
        whole(_email),
        (0, 2),  # the hit runs from the local part's start to the domain's end
    ),
    Detector(
        "card_number",
        re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?![\d-])"),
        whole(_card),
        (2, 2),  # the hit is the chain of digit runs; a look-ahead needs a character after it
    ),
    Detector(
        "ip_address",
        re.compile(
            r"(?<![\w.:])(?:\d{1,3}(?:\.\d{1,3}){3}(?!\.?\w)|(?=[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:)(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:]))"
        ),
        whole(_ip),
        (4, 4),  # the hit holds the whole address (IPv4's four groups, IPv6's run of hex and colons)
    ),
    Detector(
        "phone",
        re.compile(
            r"(?<![\w+.-])(?<!\d[ .-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}(?![\w-]|[ .-]\d)"
        ),
        whole(_phone),
        (8, 4),  # before the hit: a country code, a parenthesis
    ),
)
"""In priority order: where two matches overlap, the earlier type's wins (a key block's lines
are not also phone numbers)."""


CONTEXT_BYTES = 64
"""Bytes of the text before a window that its string holds too: the look-behinds and the IPv4
check's 16 characters see the text there, as they would in the whole text."""


@dataclass
class Findings:
    """Per text: its spans ``(start, end, type)`` in bytes of the text's UTF-8; ``counts[type]``
    occurrences in the batch."""

    spans: dict[int, list[tuple[int, int, str]]]
    counts: Counter


def find_pii(texts: pa.Array, config: PiiConfig, batch: BatchBytes | None = None) -> Findings:
    """Every occurrence of each active type in a batch (non-overlapping, by priority).

    One compiled pass over the batch's bitmaps (``batch``: of ``texts``, when the caller has
    them) finds every type's prefilter hits at once (most documents have none); each type's
    Python pattern and check then run on the windows around its own hits only, each window
    decoded from the batch's bytes (no document is copied out whole)."""
    modes = config.active()
    found: dict[int, list[tuple[int, int, str]]] = {}
    detectors = [d for d in DETECTORS if d.kind in modes]
    if not detectors or len(texts) == 0:
        return Findings(found, Counter())
    batch = batch or batch_bytes(texts)
    hits = _hits(batch, detectors, config)
    reader = _WindowReader(batch)
    for detector in detectors:  # in priority order, as _non_overlapping needs
        search = _per_hit if detector.per_hit else _in_windows
        for index, window, match, base in search(hits, detector, batch, reader):
            span = detector.span(match, window, config)
            if span is not None:
                first, last = span if reader.ascii[index] else (len(window[:s].encode()) for s in span)
                found.setdefault(index, []).append((base + first, base + last, detector.kind))
        checked = _CHECKED.get(detector.kind)
        if checked is not None:
            for index, start, stop in checked(hits, reader, config):
                found.setdefault(index, []).append((start, stop, detector.kind))
    counts: Counter = Counter()
    for index, spans in found.items():
        found[index] = kept = _non_overlapping(spans)
        counts.update(kind for _, _, kind in kept)
    return Findings(found, counts)


@dataclass(frozen=True)
class Hits:
    """Every prefilter hit of a batch: its detector (index in DETECTORS, or one of the exact
    kinds of :mod:`tasks.safety.pii_scan`), its text and its bytes there, sorted by detector,
    text and start."""

    detector: np.ndarray
    text: np.ndarray
    start: np.ndarray
    stop: np.ndarray


def _hits(batch: BatchBytes, detectors: list[Detector], config: PiiConfig) -> Hits:
    data, offsets = batch.data, batch.offsets
    active = np.array([d in detectors for d in DETECTORS], np.bool_)
    capacity = 4096 + len(data) // 512
    while True:
        count, rows = pii_scan.pii_hits(
            data, offsets, batch.maps.digits, batch.maps.events, active, config.min_secret_chars,
            pii_scan.LITERALS, pii_scan.NAME_BYTES, pii_scan.NAME_LENGTHS, capacity,
        )  # fmt: skip
        if count <= capacity:
            break
        capacity = count
    kind, text, start, end = rows[:count].T.copy()
    start -= offsets[text]
    end -= offsets[text]
    order = np.lexsort((start, text, kind))
    return Hits(kind[order], text[order], start[order], end[order])


def _windows(hits: Hits, detector: Detector, batch: BatchBytes) -> list[tuple[int, ...]]:
    """``(text, start, end)``: the byte windows ``detector``'s pattern runs on: ``reach``
    characters around each of its hits, merged where they overlap; the whole text when
    ``reach`` is None. A ``per_hit`` detector's are not merged, and say where the hit stops:
    ``(text, start, end, stop)``."""
    own = hits.detector == DETECTORS.index(detector)
    text, start, stop = hits.text[own], hits.start[own], hits.stop[own]
    lengths = np.diff(batch.offsets)[text]
    if detector.reach is None:
        return [
            (i, 0, int(n))
            for i, n in zip(*np.unique(np.stack([text, lengths]), axis=1).tolist(), strict=True)
        ]
    if not len(text):
        return []
    before, after = detector.reach
    a = np.maximum(start - before, 0)
    b = np.minimum(stop + after, lengths)
    wide = ~batch.ascii[text]
    if wide.any():  # the reach in characters, as a pattern counts them
        a[wide], b[wide] = pii_scan.char_reach(
            batch.data, batch.offsets, text[wide], start[wide], stop[wide], before, after
        )
    if detector.per_hit:
        return list(zip(text.tolist(), a.tolist(), b.tolist(), stop.tolist(), strict=True))
    key = text << 40  # texts apart: a window never merges into the next text's
    b = key + b
    reach = np.maximum.accumulate(b)
    new = np.ones(len(a), bool)
    new[1:] = key[1:] + a[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(a) - 1)
    return list(
        zip(text[firsts].tolist(), a[firsts].tolist(), (reach[lasts] - key[lasts]).tolist(), strict=True)
    )


Found = tuple[int, str, re.Match[str], int]  # (text, window, match, the window's first byte)


def _in_windows(hits: Hits, detector: Detector, batch: BatchBytes, reader: _WindowReader) -> Iterator[Found]:
    """Every match of ``detector``'s pattern in its windows."""
    for index, start, end in _windows(hits, detector, batch):
        window, pos, base = reader.window(index, start, end)
        for match in detector.pattern.finditer(window, pos):
            yield index, window, match, base


def _per_hit(hits: Hits, detector: Detector, batch: BatchBytes, reader: _WindowReader) -> Iterator[Found]:
    """The matches of a pattern whose hits say where a match may start (a secret's: from its
    name to its separator): tried there only, in order, and as a search through the whole text
    would find them: a match, taken or refused by the check, hides the hits inside it."""
    done: dict[int, int] = {}  # text -> the byte where its last match ended
    for index, start, end, stop in _windows(hits, detector, batch):
        start = max(start, done.get(index, 0))
        if start >= stop:
            continue
        window, pos, base = reader.window(index, start, end)
        for at in range(pos, pos + reader.chars(index, start, stop)):
            match = detector.pattern.match(window, at)
            if match is not None:
                ended = match.end() if reader.ascii[index] else len(window[: match.end()].encode())
                done[index] = base + ended
                yield index, window, match, base
                break


def _checked_ipv4(hits: Hits, reader: _WindowReader, config: PiiConfig) -> Iterator[tuple[int, int, int]]:
    """``(text, start, stop)`` of the IPv4 addresses the compiled pass checked whole
    (``pii_scan.IPV4_EXACT``) whose words before are no version's: what the pattern and
    ``_ipv4`` accept, without a window to search (a window's search took most of the
    detector's time)."""
    for index, start, stop in _of_kind(hits, pii_scan.IPV4_EXACT):
        before, pos, _ = reader.window(index, start, start)
        if not VERSION_BEFORE.search(before[max(0, pos - 16) : pos]):
            yield index, start, stop


def _checked_emails(hits: Hits, reader: _WindowReader, config: PiiConfig) -> Iterator[tuple[int, int, int]]:
    """``(text, start, stop)`` of the e-mail addresses the compiled pass matched whole
    (``pii_scan.EMAIL_EXACT``, ASCII bytes) at domains the config does not allow."""
    allowed = _dotted(tuple(config.allow_email_domains))
    for index, start, stop in _of_kind(hits, pii_scan.EMAIL_EXACT):
        first = reader.offsets[index]
        domain = str(reader.bytes[first + start : first + stop], "ascii").rsplit("@", 1)[1].lower()
        if not ("." + domain).endswith(allowed):
            yield index, start, stop


def _of_kind(hits: Hits, kind: int) -> Iterator[tuple[int, int, int]]:
    own = hits.detector == kind
    return zip(hits.text[own].tolist(), hits.start[own].tolist(), hits.stop[own].tolist(), strict=True)


_CHECKED = {"ip_address": _checked_ipv4, "email": _checked_emails}
"""The detectors some of whose hits the compiled pass matched whole, and what checks those."""


class _WindowReader:
    """Windows of a batch's texts as strings, decoded from its bytes in place."""

    def __init__(self, batch: BatchBytes):
        self.bytes = memoryview(batch.data)
        self.offsets = batch.offsets.tolist()
        self.ascii = batch.ascii.tolist()

    def window(self, index: int, start: int, end: int) -> tuple[str, int, int]:
        """``(string, pos, base)``: bytes ``base .. end`` of text ``index`` decoded, ``base`` up
        to CONTEXT_BYTES before ``start``; the pattern searches from character ``pos`` (byte
        ``start``). Edges inside a character move to its end."""
        first = self.offsets[index]
        base = max(start - CONTEXT_BYTES, 0)
        if self.ascii[index]:
            return str(self.bytes[first + base : first + end], "ascii"), start - base, base
        stop = self.offsets[index + 1]
        base, start, end = (self._char_edge(first + at, stop) - first for at in (base, start, end))
        window = str(self.bytes[first + base : first + end], "utf-8", "replace")
        return window, len(str(self.bytes[first + base : first + start], "utf-8", "replace")), base

    def chars(self, index: int, start: int, end: int) -> int:
        """The characters of bytes ``start .. end`` of text ``index``."""
        if self.ascii[index]:
            return end - start
        first = self.offsets[index]
        return len(str(self.bytes[first + start : first + end], "utf-8", "replace"))

    def _char_edge(self, at: int, stop: int) -> int:
        """``at``, or past the UTF-8 continuation bytes there (before ``stop``)."""
        while at < stop and self.bytes[at] & 0xC0 == 0x80:
            at += 1
        return at


def _non_overlapping(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Spans found first (higher priority) win; the rest of an overlap is dropped."""
    kept: list[tuple[int, int, str]] = []  # sorted by start, never overlapping
    for span in spans:  # already in priority order
        at = bisect.bisect(kept, span)
        if (at == 0 or kept[at - 1][1] <= span[0]) and (at == len(kept) or span[1] <= kept[at][0]):
            kept.insert(at, span)
    return kept


def redact_texts(
    texts: pa.Array, findings: Findings, batch: BatchBytes | None = None, rows: np.ndarray | None = None
) -> pa.Array:
    """The texts at ``rows`` (all of them by default), each span of ``findings`` replaced by its
    type's placeholder (``batch``: the bytes of ``texts``, when the caller has them). The bytes
    are copied once, a run of rows without spans as one piece."""
    every = rows is None
    rows = np.arange(len(texts)) if rows is None else np.asarray(rows, np.int64)
    if not any(row in findings.spans for row in rows.tolist()):
        return texts if every else texts.take(pa.array(rows, pa.int64()))
    batch = batch or batch_bytes(texts)
    data, offsets = batch.data, batch.offsets.tolist()
    pieces: list[np.ndarray] = []
    lengths = np.diff(batch.offsets)[rows]
    run_start = run_stop = -1  # the bytes of the rows without spans gathered so far
    for k, row in enumerate(rows.tolist()):
        start, stop = offsets[row], offsets[row + 1]
        spans = findings.spans.get(row)
        if spans is None and run_stop == start:
            run_stop = stop
            continue
        if run_stop > run_start:
            pieces.append(data[run_start:run_stop])
        if spans is None:
            run_start, run_stop = start, stop
            continue
        run_start = run_stop = -1
        last, grown = start, 0
        for first, end, kind in spans:
            placeholder = PLACEHOLDER_BYTES[kind]
            pieces += [data[last : start + first], placeholder]
            grown += len(placeholder) - (end - first)
            last = start + end
        pieces.append(data[last:stop])
        lengths[k] += grown
    if run_stop > run_start:
        pieces.append(data[run_start:run_stop])
    out_offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    large = texts.type == pa.large_string() or out_offsets[-1] >= 2**31
    string_type = pa.large_string() if large else pa.string()
    out = pa.Array.from_buffers(
        string_type,
        len(rows),
        [
            None,
            pa.py_buffer(out_offsets if large else out_offsets.astype(np.int32)),
            pa.py_buffer(np.concatenate(pieces)),
        ],
    )
    if texts.null_count:
        out = pc.if_else(texts.is_valid().take(pa.array(rows, pa.int64())), out, pa.scalar(None, string_type))
    return out if out.type == texts.type else out.cast(texts.type)


PLACEHOLDER_BYTES = {kind: np.frombuffer(text.encode(), np.uint8) for kind, text in PLACEHOLDERS.items()}
