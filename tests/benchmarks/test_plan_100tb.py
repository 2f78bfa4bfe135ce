"""benchmarks/plan_100tb.py: the plan from the committed measurements, and one sentence naming
the run to make when a measurement it reads is missing."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_plan():
    spec = importlib.util.spec_from_file_location("plan_100tb", ROOT / "benchmarks" / "plan_100tb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def results(tmp_path, monkeypatch):
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        shutil.copy(path, tmp_path)
    plan = load_plan()
    monkeypatch.setattr(plan, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["plan_100tb.py", "--scale-json", str(tmp_path / "scale.json")])
    return plan, tmp_path


def test_the_plan_prints_objects_memory_and_core_hours(results, capsys):
    plan, _ = results
    assert plan.main() == 0
    out = capsys.readouterr().out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("plan_100tb: core_hours=") and "largest_task=" in summary
    assert "objects_per_part_step=372,530" in summary  # one bundle per 256 MiB part
    assert "| dedup components / representatives: one bucket's nodes and edges |" in out


def test_a_missing_measurement_names_the_run_to_make(results):
    plan, folder = results
    ingest = json.loads((folder / "ingest_filter.json").read_text())
    del ingest["full_stage_once"]  # what a run without --stage records
    (folder / "ingest_filter.json").write_text(json.dumps(ingest))
    with pytest.raises(SystemExit, match=r"ingest_filter.json has no full_stage_once.cpu_seconds; make it with "
                       r"`.venv/bin/python benchmarks/ingest_filter.py --stage` first"):  # fmt: skip
        plan.main()
    (folder / "shard.json").unlink()
    ingest["full_stage_once"] = {"cpu_seconds": 1.0}
    (folder / "ingest_filter.json").write_text(json.dumps(ingest))
    with pytest.raises(
        SystemExit, match=r"shard.json is missing; make it with `.venv/bin/python benchmarks/shard.py`"
    ):
        plan.main()
