"""From bytes or strings to normalised document text, and the reasons a text is refused.

Byte-level checks run once per document in Python (they are C-speed ``bytes`` methods);
normalisation runs vectorised over a whole batch with pyarrow compute:
a leading BOM dropped, line endings unified to ``\\n``, NUL and other control characters
removed (tab and newline kept), Unicode NFC.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

BINARY_SAMPLE_BYTES = 8192
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # little-endian, big-endian
# C0 controls except tab, line feed, vertical tab, form feed, carriage return; ESC (0x1b) is
# common in terminal logs, so it does not make a text binary; DEL.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_CONTROL_CHARS_RE = "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f\\x{80}-\\x{84}\\x{86}-\\x{9f}]"
_BINARY_CHARS_RE = "[\\x00-\\x08\\x0e-\\x1a\\x1c-\\x1f\\x7f]"
_LINE_BREAKS_RE = "\\r\\n?|[\\x{85}\\x{2028}\\x{2029}]"


def looks_like_utf16(sample: bytes) -> bool:
    """UTF-16 text without a BOM: one byte of each pair is mostly NUL."""
    if len(sample) < 4:
        return False
    half = len(sample) // 2
    return max(sample[0::2].count(0), sample[1::2].count(0)) > 0.3 * half


def control_fraction(sample: bytes) -> float:
    if not sample:
        return 0.0
    return (len(sample) - len(sample.translate(None, _CONTROL_BYTES))) / len(sample)


def has_utf16_bom(data: bytes) -> bool:
    return data.startswith(UTF16_BOMS)


def decode_document(data: bytes, binary_control_fraction: float) -> tuple[str | None, str | None, str]:
    """``(text, None, "")`` for UTF-8 text or UTF-16 text with a BOM, else ``(None, reason, detail)``.

    Binary is judged before decoding: random bytes are also invalid UTF-8, and "binary" is
    the more useful reason. A few NUL bytes in otherwise good text are not binary: they are
    removed by :func:`normalize_texts`. UTF-16 is read only with its BOM, which says the byte
    order; text decoded from UTF-16 is judged for binary content afterwards, as characters
    (``Record.check_binary``), since half its bytes are NUL.
    """
    if has_utf16_bom(data):
        try:
            return data.decode("utf-16"), None, ""
        except UnicodeDecodeError as exc:
            return None, "undecodable", f"invalid UTF-16 at byte {exc.start}: {exc.reason}"
    sample = data[:BINARY_SAMPLE_BYTES]
    if looks_like_utf16(sample):
        return (
            None,
            "undecodable",
            "UTF-16 text without a BOM (NUL in every other byte); only UTF-8, or UTF-16 with a BOM, is read",
        )
    share = control_fraction(sample)
    if share > binary_control_fraction:
        return (
            None,
            "binary",
            (
                f"{share:.0%} control bytes in the first {len(sample)} bytes > binary_control_fraction "
                f"{binary_control_fraction:g}"
            ),
        )
    try:
        return data.decode("utf-8"), None, ""
    except UnicodeDecodeError as exc:
        return None, "undecodable", f"invalid UTF-8 at byte {exc.start}: {exc.reason}"


def preview(data: bytes, chars: int) -> str:
    """What the quarantine keeps of a document that could not be decoded."""
    return data[: chars * 4].decode("utf-8", errors="replace")[:chars]


def binary_text_mask(texts: pa.Array, binary_control_fraction: float) -> pa.Array:
    """True where a decoded string (from JSON or Parquet) is mostly control characters."""
    head = pc.utf8_slice_codeunits(texts, 0, BINARY_SAMPLE_BYTES)
    controls = pc.count_substring_regex(head, _BINARY_CHARS_RE).cast(pa.float64())
    limit = pc.multiply(pc.utf8_length(head).cast(pa.float64()), binary_control_fraction)
    return pc.fill_null(pc.greater(controls, limit), False)


def normalize_texts(texts: pa.Array) -> pa.Array:
    """BOM dropped, line endings unified, control characters removed, NFC."""
    texts = pc.replace_substring_regex(texts, "^\\x{feff}", "", max_replacements=1)
    texts = pc.replace_substring_regex(texts, _LINE_BREAKS_RE, "\n")
    texts = pc.replace_substring_regex(texts, _CONTROL_CHARS_RE, "")
    return pc.utf8_normalize(texts, "NFC")
