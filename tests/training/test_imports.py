"""The trainer runs where only PyTorch and pydantic are installed (a GPU machine, a torchrun
worker): nothing it imports may pull in Prefect, Great Expectations or the lakeFS SDK."""

from __future__ import annotations

import subprocess
import sys

from tests.training.helpers import ROOT

HEAVY = ("prefect", "great_expectations", "lakefs", "lakefs_sdk", "flows", "tasks")


def test_the_trainer_and_the_gpu_benchmark_import_no_orchestration_or_lakefs_packages():
    probe = (
        "import sys; sys.path.insert(0, 'benchmarks');"
        "import training.trainer, training.__main__, gpu_train, versioning.local;"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
