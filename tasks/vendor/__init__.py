"""Third-party files the Data Docs pages need offline that no PyPI package ships.

``bootstrap-table-1.19.1/``: the version Great Expectations' page templates load from unpkg
(its tables, and their filter-control extension), copied unchanged from the npm package
``bootstrap-table@1.19.1`` (MIT, ``LICENSE`` beside it). To reproduce the copy::

    npm pack bootstrap-table@1.19.1   # sha256 80f84cbf2f8f92e0d5444a82fb99495ab8a286b5cdb0594102e568eb9d9fa69a
    tar xzf bootstrap-table-1.19.1.tgz package/dist package/LICENSE

:data:`SHA256` records each file; ``tests/tasks/test_gates.py`` checks them, so an
edit by hand shows up. Font Awesome and bootstrap-datepicker come from their XStatic packages.
"""

from __future__ import annotations

from pathlib import Path

BOOTSTRAP_TABLE = Path(__file__).parent / "bootstrap-table-1.19.1"
SHA256 = {
    "LICENSE": "fb50e42cb539382385f8d66572fef8ec08a34dd7dc00ba7a5ce0668d225dc35b",
    "bootstrap-table.min.css": "643f536f6982af4d7287af23f89ad457dd7e4a82f9c695330a112b0881c30a4a",
    "bootstrap-table.min.js": "06a571a9beb50bd5ddd60517159775dfec1f3e798fff38fb117ae2350dc9ba9d",
    "extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "be4e0c0d11f9319f1ad191f7447a38f755728bbaa10903e469f367441ba79ae2"
    ),
    "extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "111f68d31d1bdd714f9503bf5f4e162e0739c363e4ff2feef950d39e78266ffc"
    ),
}
