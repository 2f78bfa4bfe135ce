"""Generated web data for the WARC example, the tests and ``benchmarks/extract.py``: news-like pages
whose main text and boilerplate (navigation, cookie banner, ads, related links, footer) are known
line by line, written as WARC files by hand (the WARC/1.1 record layout, a gzip member per record)
and as HTML files. Nothing is downloaded.

    python -m flows.demo_web DEST [--pages N]

writes ``DEST/warc/crawl-00000.warc.gz`` (+ a plain ``.warc``) with one of each bad record the
ingest stage quarantines, and ``DEST/html/`` with pages as files; ``examples/web.toml`` reads them.
``DEST/safety/crawl-safety.warc.gz`` holds pages for the safety stage (``examples/web_safety.toml``):
some on a blocked domain or under a blocked path, some quoting a benchmark item
(``examples/web_safety/science_qa.jsonl``), some with a reporter's e-mail address and phone number, one with an AWS key.
"""

from __future__ import annotations

import argparse
import gzip
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

_WORDS = [
    "river",
    "mountain",
    "engineer",
    "library",
    "window",
    "garden",
    "signal",
    "teacher",
    "market",
    "harbor",
    "forest",
    "planet",
    "letter",
    "village",
    "museum",
    "kitchen",
    "bridge",
    "doctor",
    "station",
    "island",
    "journey",
    "machine",
    "painter",
    "orchard",
    "valley",
    "pattern",
    "lantern",
    "meadow",
    "captain",
    "student",
    "archive",
    "theory",
    "harvest",
    "chapter",
    "season",
    "factory",
    "mirror",
    "compass",
    "council",
]
_VERBS = [
    "describes",
    "follows",
    "carries",
    "protects",
    "measures",
    "builds",
    "studies",
    "finds",
    "reaches",
    "changes",
    "explains",
    "records",
]
_ADJECTIVES = [
    "quiet",
    "ancient",
    "careful",
    "bright",
    "narrow",
    "patient",
    "distant",
    "gentle",
    "rapid",
    "simple",
    "crowded",
    "hidden",
]
_SECTIONS = ["World", "Science", "Culture", "Business", "Sport", "Travel", "Opinion", "Technology"]


@dataclass(frozen=True)
class Page:
    """A generated page and the truth about it: which lines are main text and which boilerplate."""

    url: str
    html: str
    main_lines: list[str]
    boilerplate_lines: list[str] = field(default_factory=list)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_ADJECTIVES), rng.choice(_WORDS), rng.choice(_VERBS), "the"]
    words += [rng.choice(_ADJECTIVES), rng.choice(_WORDS), "of", "the", rng.choice(_WORDS)]
    if rng.random() < 0.6:
        words += [
            rng.choice(["while", "because", "after", "when"]),
            "the",
            rng.choice(_WORDS),
            rng.choice(_VERBS),
        ]
        words += ["it", "with", rng.choice(_ADJECTIVES), rng.choice(_WORDS)]
    return "The " + " ".join(words) + "."


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _boilerplate(rng: random.Random, index: int, site: str) -> dict[str, list[str]]:
    tag = f"{index:05d}"
    return {
        "nav": ["Home", *rng.sample(_SECTIONS, 5), f"Subscribe to {site} {tag}"],
        "banner": [f"We use cookies to improve your experience on {site} (notice {tag}). Accept all cookies"],
        "ads": [
            f"Sponsored: cheap {rng.choice(_WORDS)} deals near you, offer {tag}",
            f"Advertisement: win a {rng.choice(_ADJECTIVES)} {rng.choice(_WORDS)} today, code {tag}",
        ],
        "related": [f"Related: {_sentence(rng)[:-1]} ({tag}-{k})" for k in range(3)],
        "promo": [f"Read more: {_paragraph(rng, 2)} Join {site} Plus for {tag} cents a week."],
        "about": [f"{site} is an independent newsroom. {_paragraph(rng, 2)} Reader services desk {tag}."],
        "footer": [
            f"Copyright 2024 {site} Media Group, page {tag}. All rights reserved.",
            "Privacy policy",
            "Terms of use",
            f"Contact the {site} newsroom {tag}",
        ],
    }


def make_page(rng: random.Random, index: int, site: str = "Example News") -> Page:
    """One page in one of three layouts (semantic HTML5, div soup, a table layout)."""
    url = f"https://news{index % 7}.example.org/{rng.choice(_SECTIONS).lower()}/story-{index:05d}.html"
    title = f"{rng.choice(_ADJECTIVES).title()} {rng.choice(_WORDS)} report {index:05d}"
    paragraphs = [_paragraph(rng, rng.randint(3, 6)) for _ in range(rng.randint(4, 9))]
    parts = _boilerplate(rng, index, site)
    nav = "".join(f'<li><a href="/{w.lower()}">{w}</a></li>' for w in parts["nav"])
    ads = "".join(f'<div class="ad-slot"><a href="/ad">{a}</a></div>' for a in parts["ads"])
    related = "".join(f'<li><a href="/r{k}">{r}</a></li>' for k, r in enumerate(parts["related"]))
    footer = f"<p>{parts['about'][0]}</p>" + "".join(f'<p><a href="/f">{f}</a></p>' for f in parts["footer"])
    promo = f'<div class="box"><p>{parts["promo"][0]}</p></div>'
    body = "".join(f"<p>{p}</p>" + (promo if k == 1 else "") for k, p in enumerate(paragraphs))
    banner = f'<div class="cookie-banner" id="cookie-consent"><p>{parts["banner"][0]}</p></div>'
    head = (
        f'<head><meta charset="utf-8"><title>{title} | {site}</title>'
        f'<link rel="canonical" href="{url}"><script>var tracking = "{index}";</script>'
        "<style>.ad-slot{float:right}</style></head>"
    )
    layout = index % 3
    if layout == 0:
        page = (
            f'<body>{banner}<header><nav class="menu"><ul>{nav}</ul></nav></header>'
            f'<main><article><h1>{title}</h1>{body}</article><aside class="sidebar">{ads}'
            f'<h3>Related stories</h3><ul>{related}</ul></aside></main><footer class="site-footer">{footer}</footer></body>'
        )
    elif layout == 1:
        page = (
            f'<body><div id="header"><div class="navigation"><ul>{nav}</ul></div></div>{banner}'
            f'<div id="wrapper"><div class="content" id="main-content"><h1>{title}</h1>{body}</div>'
            f'<div class="sidebar widget-area">{ads}<ul class="related-posts">{related}</ul></div></div>'
            f'<div id="footer" class="footer">{footer}</div></body>'
        )
    else:
        page = (
            f'<body><table><tr><td class="menu"><ul>{nav}</ul></td></tr>'
            f'<tr><td class="post-body"><h1>{title}</h1>{body}</td><td class="sidebar">{ads}</td></tr>'
            f'<tr><td class="related"><ul>{related}</ul></td></tr><tr><td class="footer">{footer}</td></tr></table>'
            f"{banner}</body>"
        )
    html = f'<!DOCTYPE html><html lang="en">{head}{page}</html>'
    # the boilerplate judged is what is unique to a page; bare menu words (Home, Sport) are not
    boilerplate = [line for key, lines in parts.items() for line in lines if key != "nav"] + parts["nav"][-1:]
    return Page(url, html, [title, *paragraphs], boilerplate)


BENCHMARK_QUESTION = (  # item sci-1 of examples/web_safety/science_qa.jsonl
    "What is the boiling point of liquid nitrogen measured at standard atmospheric pressure in degrees kelvin"
)
CONTACT = "Write to the reporter at jane.doe@harbor-courier.news or call +1 415-555-0132."
UNSAFE_PAGES = {  # page index -> (URL, or None to keep it; a paragraph added to the main text, or None)
    0: ("https://www.spam-farm.test/deals/story-00000.html", None),  # blocked domain (and subdomains)
    1: ("https://cdn.spam-farm.test/story-00001.html", None),
    2: ("https://news.example.org/private/leak-00002.html", None),  # blocked path prefix
    3: (None, f"Quiz corner. {BENCHMARK_QUESTION.upper()}? Answers next week."),  # contaminated
    4: (None, f"From the archive: {BENCHMARK_QUESTION}."),
    5: (None, CONTACT),  # redacted: <EMAIL>, <PHONE>
    6: (None, CONTACT),
    7: (None, CONTACT),
    8: (None, "Our build log printed the deploy key AKIA4QZ7R2M9X8V6KD3L by mistake."),  # quarantined: secret
}


def make_unsafe_pages(count: int, seed: int = 1) -> list[Page]:
    """``count`` pages, the first ones changed as ``UNSAFE_PAGES`` says."""
    pages = make_pages(count, seed)
    for index, (url, paragraph) in UNSAFE_PAGES.items():
        page = pages[index]
        html, main = page.html, list(page.main_lines)
        if url is not None:
            html = html.replace(f'href="{page.url}"', f'href="{url}"')
        if paragraph is not None:
            html = html.replace("</h1>", f"</h1><p>{paragraph}</p>", 1)
            main.insert(1, paragraph)
        pages[index] = Page(url or page.url, html, main, page.boilerplate_lines)
    return pages


def make_pages(count: int, seed: int = 0) -> list[Page]:
    rng = random.Random(seed)
    return [make_page(rng, i) for i in range(count)]


def warc_record(
    url: str,
    payload: bytes,
    content_type: str = "text/html; charset=utf-8",
    *,
    record_type: str = "response",
    status: str = "200 OK",
    date: str = "2024-05-01T12:00:00Z",
    extra_headers: tuple[tuple[str, str], ...] = (),
    declared_length: int | None = None,
) -> bytes:
    """One WARC/1.1 record; a ``response`` wraps ``payload`` in an HTTP response. ``declared_length``
    overrides the Content-Length (a record cut short)."""
    if record_type == "response":
        http = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n"
        block, block_type = http.encode() + payload, "application/http; msgtype=response"
    elif record_type == "request":
        block, block_type = (
            f"GET {url} HTTP/1.1\r\nHost: example.org\r\n\r\n".encode(),
            "application/http; msgtype=request",
        )
    else:
        block, block_type = payload, content_type
    rid = uuid.uuid5(uuid.NAMESPACE_URL, f"{record_type}:{url}:{len(payload)}")
    headers = [
        ("WARC-Type", record_type),
        ("WARC-Record-ID", f"<urn:uuid:{rid}>"),
        ("WARC-Date", date),
        ("WARC-Target-URI", url),
        ("Content-Type", block_type),
        *extra_headers,
        ("Content-Length", str(len(block) if declared_length is None else declared_length)),
    ]
    head = "WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode() + block + b"\r\n\r\n"


def write_warc(path: Path, records: list[bytes], compress: bool | None = None) -> Path:
    """Records into a WARC file; ``.gz`` (or ``compress``): one gzip member per record, as crawlers write them."""
    compress = path.name.endswith(".gz") if compress is None else compress
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for record in records:
            f.write(gzip.compress(record, mtime=0) if compress else record)
    return path


def bad_records(oversized_bytes: int) -> dict[str, bytes]:
    """One record of each kind the ingest stage quarantines from a WARC file, by its reason."""
    base = "https://bad.example.org"
    return {
        "not_html": warc_record(f"{base}/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(200), "image/png"),
        "bad_charset": warc_record(
            f"{base}/latin.html",
            "<html><body><p>caf\u00e9 cr\u00e8me</p></body></html>".encode("latin-1"),
            "text/html; charset=utf-8",
        ),
        "empty_extraction": warc_record(
            f"{base}/empty.html", b"<html><head><script>var x = 1;</script></head><body></body></html>"
        ),
        "oversized_page": warc_record(
            f"{base}/huge.html",
            b"<html><body><p>" + b"big page " * (oversized_bytes // 9 + 1) + b"</p></body></html>",
        ),
        "http_status": warc_record(
            f"{base}/moved.html", b"<html><body>Moved</body></html>", status="301 Moved"
        ),
        "truncated_record": warc_record(
            f"{base}/cut.html",
            b"<html><body><p>cut short</p></body></html>",
            extra_headers=(("WARC-Truncated", "length"),),
        ),
    }


def write_web_sample(
    dest: Path, pages: int = 60, seed: int = 0, oversized_bytes: int = 300_000
) -> dict[str, Path]:
    """``dest/warc/`` (a ``.warc.gz`` with request records and the bad records, a plain ``.warc``) and
    ``dest/html/`` (a few pages as files). Deterministic: a second call writes the same bytes."""
    generated = make_pages(pages, seed)
    half = len(generated) // 2
    records = []
    for page in generated[:half]:
        records += [
            warc_record(page.url, b"", record_type="request"),
            warc_record(page.url, page.html.encode()),
        ]
    records += list(bad_records(oversized_bytes).values())
    warc = dest / "warc"
    write_warc(warc / "crawl-00000.warc.gz", records)
    write_warc(warc / "crawl-00001.warc", [warc_record(p.url, p.html.encode()) for p in generated[half:]])
    html = dest / "html"
    html.mkdir(parents=True, exist_ok=True)
    for i, page in enumerate(generated[: min(10, len(generated))]):
        (html / f"page-{i:03d}.html").write_text(page.html, encoding="utf-8")
    safety = dest / "safety"
    unsafe = make_unsafe_pages(max(pages // 2, len(UNSAFE_PAGES) + 10), seed + 1)
    write_warc(safety / "crawl-safety.warc.gz", [warc_record(p.url, p.html.encode()) for p in unsafe])
    return {"warc": warc, "html": html, "safety": safety}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.demo_web", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--pages", type=int, default=60)
    args = parser.parse_args(argv)
    written = write_web_sample(args.dest, args.pages)
    print(f"web sample: {written['warc']}, {written['html']} and {written['safety']}")


if __name__ == "__main__":
    main()
