"""Data Docs opened the way a user opens them: ``file://`` pages in a real browser, no network.

Headless Chromium (Debian's ``chromium``; the test is skipped, saying so, where it is not
installed) loads a gate's Data Docs, one that holds and one that fails, with every network
request refused. After the page's scripts ran, the index's tables must have rows, the
validation page's Status cells must show Font Awesome icons, and no script error may be logged.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from tasks.data_docs import make_offline
from tasks.gates import Coverage, GateCheck, run_gate
from tasks.schema import document_id
from tests.tasks.test_gates import _documents  # the documents of the raw_documents suite

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"
)

# Appended to a copy of a page: writes what the browser made of the page into the DOM it dumps.
PROBE = """
<script>
window.addEventListener("load", function () {
  document.fonts.ready.then(function () {
    var icons = Array.from(document.querySelectorAll("i.fas, i.fa"));
    var drawn = icons.filter(function (i) {
      var before = getComputedStyle(i, "::before");
      return before.content && before.content !== "none" && /Font Awesome/.test(before.fontFamily);
    });
    var probe = document.createElement("div");
    probe.id = "tokenlake-probe";
    probe.dataset.icons = icons.length;
    probe.dataset.drawn = drawn.length;
    probe.dataset.fontLoaded = document.fonts.check('900 16px "Font Awesome 6 Free"');
    document.body.appendChild(probe);
  });
});
</script>
"""


def _site(docs: Path, frame: pa.Table) -> tuple[Path, bool]:
    outcome = run_gate(
        [GateCheck("raw_documents", frame, {"sources": ["a"], "max_text_chars": 1000}, ["locator"])],
        "ingest-0123456789ab-all-3",
        Coverage.everything(frame.num_rows, "documents"),
        docs,
    )
    make_offline(docs)
    return docs, outcome.success


def _open(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and the errors the browser logged."""
    probed = page.with_name(f"probe-{page.name}")
    probed.write_text(
        page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8"
    )
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # tests run as root in CI
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--proxy-server=http://127.0.0.1:9",  # nothing may come from the network
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    errors = [
        line
        for line in result.stderr.splitlines()
        if "CONSOLE" in line and re.search(r"Uncaught|Error|is not a function|ERR_", line)
    ]
    return result.stdout, errors


def _probe(dom: str) -> dict[str, str]:
    match = re.search(r'<div id="tokenlake-probe"([^>]*)>', dom)
    assert match, "the page's load event never ran its scripts to the end"
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(1)))


@pytest.mark.parametrize("holds", [True, False], ids=["gate-holds", "gate-fails"])
def test_data_docs_index_and_validation_page_render_offline(tmp_path: Path, holds: bool) -> None:
    rows = [(None, "a", "x"), (None, "a", "y")]
    if not holds:
        rows.append((document_id("a", "x"), "a", "z"))  # a duplicate id: the uniqueness expectation fails
    docs, success = _site(tmp_path / "docs", _documents(rows))
    assert success is holds

    dom, errors = _open(docs / "index.html", tmp_path)
    assert errors == [], "\n".join(errors)
    assert "bootstrapTable is not a function" not in dom
    tables = re.findall(r"<table\b[^>]*>.*?</table>", dom, flags=re.S)
    rows_drawn = [t for t in tables if re.search(r'<tr[^>]*data-index="0"', t)]
    assert rows_drawn, "the index's tables have no rows: bootstrap-table did not build them"
    assert "No matching records found" not in "".join(rows_drawn)

    (validation,) = (docs / "validations").rglob("*.html")
    dom, errors = _open(validation, tmp_path)
    assert errors == [], "\n".join(errors)
    probe = _probe(dom)
    assert int(probe["icons"]) > 0, "the validation page shows no status icons"
    assert probe["drawn"] == probe["icons"], f"icons without Font Awesome: {probe}"
    assert probe["font-loaded"] == "true", "Font Awesome's font did not load from the vendored files"
    status = "fa-check-circle" if holds else "fa-times"
    assert status in dom
