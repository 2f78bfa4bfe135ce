"""Web pages into document candidates: the declared charset, decoding, the canonical URL, and the
main text (boilerplate such as navigation, footers and ads left out).

Shared by the ``warc`` reader (one page per response record) and the ``html`` reader (one page per
file). The extractor is resiliparse's ``extract_plain_text`` with its main-content heuristics,
chosen over trafilatura by ``benchmarks/extract.py`` (docs/ingest_validate.md gives the figures).
"""

from __future__ import annotations

import codecs
import re

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree

from tasks.ingest.readers import Record

EXTRACTOR = "resiliparse"
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain",)
CHARSET_SNIFF_BYTES = 4096  # a <meta charset> must be in the first 1024 bytes (HTML5); allow more
# undeclared pages: UTF-8 first, then windows-1252, the web's default for legacy pages (WHATWG Encoding)
UNDECLARED_CHARSETS = ("utf-8", "windows-1252")

_CHARSET_PARAM_RE = re.compile(rb"""charset\s*=\s*["']?([A-Za-z0-9._:+-]+)""", re.IGNORECASE)
_META_RE = re.compile(rb"<meta\b[^>]*>", re.IGNORECASE)
_HTML_START_RE = re.compile(rb"^\s*(?:<!doctype\s+html|<html|<head|<body)", re.IGNORECASE)


def media_type(content_type: str | None) -> str:
    """``text/html`` from ``text/HTML; charset=utf-8``; empty when there is none."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def charset_of_content_type(content_type: str | None) -> str | None:
    match = _CHARSET_PARAM_RE.search((content_type or "").encode("latin-1", "replace"))
    return match.group(1).decode("ascii").lower() if match else None


def charset_in_html(data: bytes) -> str | None:
    """The charset a page declares in ``<meta charset>`` or ``<meta http-equiv content>``."""
    for tag in _META_RE.finditer(data[:CHARSET_SNIFF_BYTES]):
        match = _CHARSET_PARAM_RE.search(tag.group(0))
        if match:
            return match.group(1).decode("ascii").lower()
    return None


def looks_like_html(data: bytes) -> bool:
    """A payload without a Content-Type that starts like an HTML document."""
    return bool(_HTML_START_RE.match(data[:1024].lstrip(b"\xef\xbb\xbf")))


def decode_page(data: bytes, declared: str | None) -> tuple[str | None, str]:
    """``(text, "")``, or ``(None, detail)`` when the page cannot be read in its charset (``bad_charset``).

    A declared charset is used strictly: a page that is not valid in the charset it declares is
    refused rather than guessed at, so mojibake never reaches the shards.
    """
    if declared is not None:
        try:
            codec = codecs.lookup(declared)
        except LookupError:
            return None, f"unknown charset {declared!r} declared"
        try:
            return data.decode(codec.name), ""
        except UnicodeDecodeError as exc:
            return None, f"invalid {declared} at byte {exc.start}: {exc.reason}"
    for charset in UNDECLARED_CHARSETS:
        try:
            return data.decode(charset), ""
        except UnicodeDecodeError as exc:
            failure = exc
    return None, f"no charset declared, and neither UTF-8 nor windows-1252 (invalid at byte {failure.start})"


def canonical_url(tree: HTMLTree) -> str | None:
    """The href of the page's ``<link rel=canonical>``, if it has one."""
    head = tree.head
    link = head.query_selector('link[rel="canonical" i]') if head is not None else None
    href = link.getattr("href") if link is not None else None
    return href.strip() or None if href else None


def main_text(tree: HTMLTree) -> str:
    """The page's main text: paragraphs and headings kept as lines, boilerplate left out."""
    return extract_plain_text(
        tree, main_content=True, preserve_formatting=True, alt_texts=False, list_bullets=False
    )


def page_record(
    data: bytes,
    locator: str,
    media: str,
    declared: str | None,
    meta: dict[str, object],
    keep_chars: int,
    find_canonical: bool = False,
) -> Record:
    """One page (its payload bytes and the media type and charset it came with) into a record.

    ``meta`` is completed with ``content_type`` and ``charset`` (the declared one, or None),
    and with ``url`` from ``<link rel=canonical>`` when ``find_canonical`` (HTML files have no other).
    """
    is_html = media in HTML_TYPES or (not media and looks_like_html(data))
    if not is_html and media not in TEXT_TYPES:
        shown = media or "no Content-Type, and the payload does not start like HTML"
        return Record(locator, "", "not_html", f"content type {shown}", meta=meta)
    if is_html and declared is None:
        declared = charset_in_html(data)
    meta = meta | {"content_type": media or "text/html", "charset": declared}
    text, detail = decode_page(data, declared)
    if text is None:
        return Record(locator, data[:keep_chars].decode("latin-1"), "bad_charset", detail, meta=meta)
    if is_html:
        tree = HTMLTree.parse(text)
        if find_canonical:
            url = canonical_url(tree)
            meta = meta | ({"url": url} if url else {})
        extracted = main_text(tree)
    else:
        extracted = text
    if not extracted.strip():
        return Record(
            locator,
            text[:keep_chars],
            "empty_extraction",
            f"no main text in {len(data)} bytes of {media or 'text/html'} ({EXTRACTOR})",
            meta=meta,
        )
    return Record(locator, extracted, meta=meta)
