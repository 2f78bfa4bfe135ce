"""The stage cache key's code version: the files a stage runs, found by reading its imports."""

from __future__ import annotations

import shutil
from pathlib import Path

from flows import caching
from formats.layout import STAGES


def _copy(root: Path) -> Path:
    for package in caching.CODE_PACKAGES:
        shutil.copytree(
            caching.PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def _names(stage: str, root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in caching.stage_source_files(stage, root)}


def test_a_stage_runs_its_package_what_it_imports_and_the_suites_never_another_stage():
    root = caching.PROJECT_ROOT
    for stage in STAGES:
        files = _names(stage, root)
        assert f"tasks/{stage}/stage.py" in files and "tasks/stage.py" in files and "tasks/gates.py" in files
        assert {"expectations/raw_documents.json", "expectations/shard_manifest.json"} <= files, "the suites"
        assert not [f for f in files if f.startswith("tasks/") and f.split("/")[1] in set(STAGES) - {stage}]
        assert not [f for f in files if f.startswith(("flows/", "training/", "versioning/"))]
    assert "tasks/quality/prose.py" in _names("validate", root), "imported by the validate stage's filters"
    assert {"tasks/tokenize.py", "formats/shards.py"} <= _names("shard", root)
    assert "formats/mix.py" in _names("mix", root)


def test_editing_a_file_changes_the_version_of_the_stages_that_run_it_only(tmp_path: Path):
    before = _copy(tmp_path / "before")
    after = _copy(tmp_path / "after")
    plan = after / "tasks" / "dedup" / "plan.py"
    plan.write_text(plan.read_text() + "\n# changed\n")
    versions = {root: {s: caching._code_version(s, root) for s in STAGES} for root in (before, after)}
    changed = {s for s in STAGES if versions[before][s] != versions[after][s]}
    assert changed == {"dedup"}

    shared = after / "tasks" / "parts.py"
    shared.write_text(shared.read_text() + "\n# changed\n")
    caching._code_version.cache_clear()
    assert all(caching._code_version(s, after) != versions[before][s] for s in STAGES), (
        "every stage writes parts"
    )
