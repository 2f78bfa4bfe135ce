"""Data Docs that render without a network.

Great Expectations' pages load Bootstrap, jQuery, bootstrap-table (with its filter-control
extension), bootstrap-datepicker and Font Awesome from CDNs, and its validation pages link the
site's own styles one folder short (so they load nowhere). Here every page gets those links
fixed and local copies of what it needs under ``static/vendor/``: Bootstrap 4, jQuery, Font
Awesome 6 and bootstrap-datepicker from their XStatic packages, bootstrap-table 1.19.1 (the
version GX's templates name) from :mod:`tasks.vendor`. The index tables are built by
bootstrap-table from data in the page, so without it they are empty; the Status column of a
validation page is Font Awesome icons, so without it it is blank.

The other remote tags go: a dark theme, the vega chart libraries (only profiling pages draw
charts; our suites' pages have none) and the remote logo. A page then looks as it does online,
on a machine with no network and from a repository object copied to disk.
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

# in the order the pages load them: jQuery before its plug-ins, bootstrap-table before its extension
STYLESHEETS = [
    "bootstrap.min.css",
    "fontawesome/css/all.min.css",
    "bootstrap-datepicker.standalone.css",
    "bootstrap-table.min.css",
    "bootstrap-table-filter-control.min.css",
]
SCRIPTS = [
    "jquery.min.js",
    "bootstrap.bundle.min.js",  # with Popper
    "bootstrap-datepicker.js",
    "bootstrap-table.min.js",
    "bootstrap-table-filter-control.min.js",
]


def vendor_files() -> dict[str, Path]:
    """{path under static/vendor/: the packaged file}."""
    import xstatic.pkg.bootstrap
    import xstatic.pkg.bootstrap_datepicker
    import xstatic.pkg.font_awesome
    import xstatic.pkg.jquery

    from tasks.vendor import BOOTSTRAP_TABLE

    bootstrap, jquery = Path(xstatic.pkg.bootstrap.BASE_DIR), Path(xstatic.pkg.jquery.BASE_DIR)
    datepicker = Path(xstatic.pkg.bootstrap_datepicker.BASE_DIR)
    font_awesome = Path(xstatic.pkg.font_awesome.BASE_DIR)
    filter_control = BOOTSTRAP_TABLE / "extensions" / "filter-control"
    files = {
        "bootstrap.min.css": bootstrap / "css" / "bootstrap.min.css",
        "jquery.min.js": jquery / "jquery.min.js",
        "bootstrap.bundle.min.js": bootstrap / "js" / "bootstrap.bundle.min.js",
        "bootstrap-datepicker.js": datepicker / "bootstrap-datepicker.js",
        "bootstrap-datepicker.standalone.css": datepicker / "bootstrap-datepicker.standalone.css",
        "bootstrap-table.min.js": BOOTSTRAP_TABLE / "bootstrap-table.min.js",
        "bootstrap-table.min.css": BOOTSTRAP_TABLE / "bootstrap-table.min.css",
        "bootstrap-table-filter-control.min.js": filter_control / "bootstrap-table-filter-control.min.js",
        "bootstrap-table-filter-control.min.css": filter_control / "bootstrap-table-filter-control.min.css",
        "fontawesome/css/all.min.css": font_awesome / "css" / "all.min.css",
    }
    # all.min.css loads its fonts from ../webfonts/
    for font in sorted((font_awesome / "webfonts").iterdir()):
        files[f"fontawesome/webfonts/{font.name}"] = font
    return files


def local_tags(prefix: str) -> str:
    """The tags that replace the remote ones, for a page ``prefix`` (``../``s) below the site root."""
    vendor = f"{prefix}{VENDOR}"
    links = [f'<link rel="stylesheet" href="{vendor}/{name}"/>' for name in STYLESHEETS]
    scripts = [f'<script src="{vendor}/{name}"></script>' for name in SCRIPTS]
    return "\n".join(links + scripts) + "\n"


def make_offline(site: Path) -> list[Path]:
    """Rewrite every page of the Data Docs site at ``site`` to use local styles and scripts;
    returns the pages rewritten."""
    target = site / VENDOR
    for name, source in vendor_files().items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
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
