"""Personal data and credentials in text: find them, replace each with a typed placeholder.

Each type is a detector: an RE2 prefilter (all types' prefilters are one alternation that
pyarrow runs over the whole batch at once: most documents contain nothing, and leave here
after that one vectorised scan), then a Python pattern and a check on the windows around the
prefilter's hits only (Luhn for cards, octet ranges for IPv4, ``ipaddress`` for IPv6, Shannon
entropy for values of secret-like names).

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
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.safety.config import PiiConfig

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
    """One type: ``prefilter`` (RE2, whole batch), ``pattern`` (Python, near the prefilter's hits
    only), and ``span``: the part of a match that is redacted, or None when the check refuses it.
    ``reach``: how far a match may start before a prefilter hit and end after it (chars), so the
    Python pattern runs on those windows only; None: on the whole text."""

    kind: str
    prefilter: str
    pattern: re.Pattern[str]
    span: Callable[[re.Match[str], str, PiiConfig], tuple[int, int] | None]
    reach: tuple[int, int] | None = (64, 64)


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
    try:
        address = ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return not (address.is_loopback or address.is_unspecified)


def _email(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    domain = match.group().rsplit("@", 1)[1].lower().rstrip(".")
    return not any(domain == d or domain.endswith("." + d) for d in config.allow_email_domains)


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
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s:,-]*)",
            re.S,
        ),
        whole(),
        None,  # a key block runs to its END line, however long
    ),
    Detector(
        "aws_key",
        r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
        re.compile(r"(?<![A-Za-z0-9+/])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        whole(_aws),
        (8, 8),
    ),
    Detector(
        "token",
        r"gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22}|xox[abprs]-[A-Za-z0-9-]{10}|"
        r"sk-[A-Za-z0-9_-]{20}|sk_(?:live|test)_[A-Za-z0-9]{16}|AIza[0-9A-Za-z_-]{35}",
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
        r"(?i)" + SECRET_NAME + r"[a-z0-9_.-]*[\"']?\s*(?::=|=>|[:=])",
        re.compile(
            r"(?i)" + SECRET_NAME + r"[a-z0-9_.-]*[\"']?\s*(?::=|=>|[:=])\s*"
            r"(?:(?P<quote>[\"'])(?P<value>[^\"'\s]{1,512})(?P=quote)|(?P<bare>[A-Za-z0-9+/=_-]{16,512})(?![\w(\[.]))"
        ),
        _secret,
        (8, 560),
    ),
    Detector(
        "email",
        r"[A-Za-z0-9._%+-]@[A-Za-z0-9-]+\.",
        re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b"),
        whole(_email),
        (72, 320),  # a local part of up to 64 before the "@", a domain of up to 255 after it
    ),
    Detector(
        "card_number",
        r"\d(?:[ -]?\d){12}",
        re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?![\d-])"),
        whole(_card),
    ),
    Detector(
        "ip_address",
        r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{1,4}",
        re.compile(
            r"(?<![\w.:])(?:\d{1,3}(?:\.\d{1,3}){3}(?!\.?\w)|(?=[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:)(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:]))"
        ),
        whole(_ip),
    ),
    Detector(
        "phone",
        r"\d{2,4}[ .)-]+\d{3,4}[ .-]\d{3,4}",
        re.compile(
            r"(?<![\w+.-])(?<!\d[ .-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}(?![\w-]|[ .-]\d)"
        ),
        whole(_phone),
    ),
)
"""In priority order: where two matches overlap, the earlier type's wins (a key block's lines
are not also phone numbers)."""


@dataclass
class Findings:
    """Per text: its spans ``(start, end, type)``; ``counts[type]`` occurrences in the batch."""

    spans: dict[int, list[tuple[int, int, str]]]
    counts: Counter


MARK = (
    "\x00"  # around each prefilter hit, to read the hits' positions back (texts holding it are scanned whole)
)
ANY_PREFILTER = "|".join(f"(?:{d.prefilter})" for d in DETECTORS)
PY_PREFILTERS = {d.kind: re.compile(d.prefilter) for d in DETECTORS}  # which types a hit is of
CONTEXT = (
    64  # chars around a hit that its types are read from (a hit hides the overlapping hits of other types)
)


def find_pii(texts: pa.Array, config: PiiConfig) -> Findings:
    """Every occurrence of each active type in a batch (non-overlapping, by priority).

    One RE2 scan of the whole batch for any type's prefilter leaves most texts behind; on the
    rest, a second marks where the hits are (their windows merged in numpy), each window's types
    are read from its hits and their context, and each type's Python pattern and check run on
    its windows only."""
    modes = config.active()
    found: dict[int, list[tuple[int, int, str]]] = {}
    any_hit = np.flatnonzero(
        np.asarray(pc.match_substring_regex(texts, ANY_PREFILTER).fill_null(False), bool)
    )
    detectors = [d for d in DETECTORS if d.kind in modes]
    if not detectors or not len(any_hit):
        return Findings(found, Counter())
    subset = texts.take(pa.array(any_hit))
    strings = subset.to_pylist()
    hits = _hits(subset)
    for detector in detectors:  # in priority order, as _non_overlapping needs
        for local, start, end in _windows(strings, hits, detector):
            text, index = strings[local], int(any_hit[local])
            for match in detector.pattern.finditer(text, start, end):
                span = detector.span(match, text, config)
                if span is not None:
                    found.setdefault(index, []).append((*span, detector.kind))
    counts: Counter = Counter()
    for index, spans in found.items():
        found[index] = kept = _non_overlapping(spans)
        counts.update(kind for _, _, kind in kept)
    return Findings(found, counts)


@dataclass(frozen=True)
class Hits:
    """Where any prefilter hit in a batch: per hit (in text order) its text and characters."""

    text: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    lengths: np.ndarray  # characters per text
    marked: np.ndarray  # texts that hold MARK themselves: their hits are unknown, they are scanned whole


def _hits(texts: pa.Array) -> Hits:
    pieces = pc.split_pattern(pc.replace_substring_regex(texts, ANY_PREFILTER, MARK + "\\0" + MARK), MARK)
    sizes = np.asarray(pc.utf8_length(pieces.flatten()), np.int64)
    first = np.asarray(pieces.offsets, np.int64)
    text_of = np.repeat(np.arange(len(texts)), np.diff(first))
    ends = np.cumsum(sizes)
    ends -= np.concatenate([[0], ends])[first[:-1]][text_of]  # characters from the start of the text
    hit = (np.arange(len(sizes)) - first[:-1][text_of]) % 2 == 1  # gap, hit, gap, hit, ..., gap
    marked = np.asarray(pc.match_substring(texts, MARK), bool)
    keep = hit & ~marked[text_of]
    lengths = np.asarray(pc.utf8_length(texts), np.int64)
    return Hits(text_of[keep], ends[keep] - sizes[keep], ends[keep], lengths, marked)


def _windows(strings: list[str], hits: Hits, detector: Detector) -> list[tuple[int, int, int]]:
    """``(text, start, end)``: the character windows ``detector``'s pattern runs on. The hits'
    windows (``reach`` around each) are merged where they overlap, and a merged window is kept
    when its hits' context holds a hit of the detector's own prefilter; a text is scanned whole
    when ``reach`` is None or its hits are unknown, if its prefilter hits it anywhere."""
    prefilter = PY_PREFILTERS[detector.kind]
    whole = range(len(strings)) if detector.reach is None else np.flatnonzero(hits.marked).tolist()
    windows = [(i, 0, len(strings[i])) for i in whole if prefilter.search(strings[i])]
    if detector.reach is None or not len(hits.text):
        return windows
    before, after = detector.reach
    a = np.maximum(hits.start - before, 0)
    key = hits.text.astype(np.int64) << 40  # texts apart: a window never merges into the next text's
    b = key + np.minimum(hits.stop + after, hits.lengths[hits.text])
    reach = np.maximum.accumulate(b)
    new = np.ones(len(a), bool)
    new[1:] = key[1:] + a[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(a) - 1)
    merged = zip(
        hits.text[firsts].tolist(),
        a[firsts].tolist(),
        (reach[lasts] - key[lasts]).tolist(),
        hits.start[firsts].tolist(),
        hits.stop[lasts].tolist(),
        strict=True,
    )
    for i, start, end, first, last in merged:
        if prefilter.search(strings[i], max(first - CONTEXT, 0), last + CONTEXT):
            windows.append((i, start, end))
    return windows


def _non_overlapping(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Spans found first (higher priority) win; the rest of an overlap is dropped."""
    kept: list[tuple[int, int, str]] = []  # sorted by start, never overlapping
    for span in spans:  # already in priority order
        at = bisect.bisect(kept, span)
        if (at == 0 or kept[at - 1][1] <= span[0]) and (at == len(kept) or span[1] <= kept[at][0]):
            kept.insert(at, span)
    return kept


def redact(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with each span replaced by its type's placeholder."""
    pieces, last = [], 0
    for start, end, kind in spans:
        pieces += [text[last:start], PLACEHOLDERS[kind]]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)
