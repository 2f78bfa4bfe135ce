"""Data Docs that render without a network: Great Expectations' pages load Bootstrap, jQuery and
a few plug-ins from CDNs, and its validation pages link the site's own styles one folder
short (so they load nowhere); here the pages get those links fixed, local copies of Bootstrap 4 and jQuery (shipped by
the ``xstatic-bootstrap`` and ``xstatic-jquery`` packages) under ``static/vendor/``, and lose
the other remote tags (table filters, date pickers, a dark theme, icon fonts, chart libraries
and the remote logo), which only decorate. The tables, cards and navigation then look as they
do online, on a machine with no network and from a repository object copied to disk.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

VENDOR = "static/vendor"
_REMOTE = r"""["']https?://[^"']*["']"""
_STYLESHEET = re.compile(rf"<link\b[^>]*href={_REMOTE}[^>]*>", re.IGNORECASE)
_SCRIPT = re.compile(rf"<script\b[^>]*src={_REMOTE}[^>]*>\s*</script>", re.IGNORECASE)
_IMAGE = re.compile(rf"<img\b[^>]*src={_REMOTE}[^>]*>", re.IGNORECASE)
_HEAD_END = re.compile(r"</head>", re.IGNORECASE)
_SITE_STATIC = re.compile(r"""(?P<attribute>(?:href|src)=["'])(?:\.\./)*static/""")


def vendor_files() -> dict[str, Path]:
    """{name under static/vendor/: the packaged file}."""
    import xstatic.pkg.bootstrap
    import xstatic.pkg.jquery

    bootstrap, jquery = Path(xstatic.pkg.bootstrap.BASE_DIR), Path(xstatic.pkg.jquery.BASE_DIR)
    return {
        "bootstrap.min.css": bootstrap / "css" / "bootstrap.min.css",
        "jquery.min.js": jquery / "jquery.min.js",
        "bootstrap.bundle.min.js": bootstrap / "js" / "bootstrap.bundle.min.js",  # with Popper
    }


def local_tags(prefix: str) -> str:
    """The tags that replace the remote ones, for a page ``prefix`` (``../``s) below the site root."""
    vendor = f"{prefix}{VENDOR}"
    return (
        f'<link rel="stylesheet" href="{vendor}/bootstrap.min.css"/>\n'
        f'<script src="{vendor}/jquery.min.js"></script>\n'
        f'<script src="{vendor}/bootstrap.bundle.min.js"></script>\n'
    )


def make_offline(site: Path) -> list[Path]:
    """Rewrite every page of the Data Docs site at ``site`` to use local styles and scripts;
    returns the pages rewritten."""
    target = site / VENDOR
    target.mkdir(parents=True, exist_ok=True)
    for name, source in vendor_files().items():
        shutil.copyfile(source, target / name)
    pages = sorted(site.rglob("*.html"))
    for page in pages:
        html = page.read_text(encoding="utf-8")
        for pattern in (_STYLESHEET, _SCRIPT, _IMAGE):
            html = pattern.sub("", html)
        prefix = "../" * (len(page.relative_to(site).parts) - 1)
        # GX counts one folder too few above its validation pages: their own styles never load
        html = _SITE_STATIC.sub(lambda m, prefix=prefix: f"{m['attribute']}{prefix}static/", html)
        html = _HEAD_END.sub(lambda _, tags=local_tags(prefix): tags + "</head>", html, count=1)
        page.write_text(html, encoding="utf-8")
    return pages
