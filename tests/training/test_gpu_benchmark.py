"""benchmarks/gpu_train.py in its CPU smoke mode: the script runs end to end and reports what it should."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from tests.training.helpers import ROOT

pytestmark = pytest.mark.slow
LAST_LINE = re.compile(
    r"^gpu_train: tokens/s=\d+ mfu=\d+\.\d% mfu_with_ckpt=\d+\.\d% stall_ms=\d+\.\d full/bare=\d+\.\d{3}$"
)


def test_the_smoke_run_reports_every_measure_and_the_last_line(tmp_path):
    out = tmp_path / "gpu_train.json"
    # a nominal peak so the MFU arithmetic runs; judged every 2 steps to cover the lagged path
    command = [
        sys.executable,
        "benchmarks/gpu_train.py",
        "--smoke",
        "--sync-every",
        "2",
        "--peak-flops",
        "1e12",
    ]
    result = subprocess.run(
        [*command, "--out", str(out), "--work-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert LAST_LINE.match(result.stdout.strip().splitlines()[-1]), result.stdout[-2000:]

    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["torch"] and report["device"]
    entry = report["presets"]["tiny"]
    assert entry["bare"]["tokens_per_s"] > 0 and 0 < entry["steady"]["mfu"] < 1
    ckpt, steady = entry["with_ckpt"], entry["steady"]
    assert ckpt["window_steps"] == steady["window_steps"] == [3, 6]
    assert ckpt["saves_in_window"] == [4, 6] and len(ckpt["stall_ms"]) == 2 and ckpt["staged_mb"] > 0
    assert steady["saves_in_window"] == [] and set(steady["final_save_ms"]) == {
        "stall",
        "write_after_last_step",
    }
    assert steady["peak_memory_mb"] > 0 and 0 <= steady["data_wait_share"] < 1
    assert entry["full_over_bare"] == pytest.approx(
        ckpt["tokens_per_s"] / entry["bare"]["tokens_per_s"], rel=1e-3
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the script would run the benchmark")
def test_a_machine_without_cuda_is_told_to_use_a_gpu_or_the_smoke_mode():
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_train.py"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 2 and "--smoke" in result.stdout
