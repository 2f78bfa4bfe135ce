"""Streaming with bounded memory: the peak resident memory of an ingest does not grow with
the size of the JSONL file, because partitions, record batches and parts are bounded.

The test compares a 64 MiB and a 256 MiB file; ``python -m tests.tasks.test_ingest_memory 2048``
measures a 2 GiB file (see docs/ingest_validate.md for the figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest

MiB = 1 << 20


def write_jsonl(path: Path, size_bytes: int) -> int:
    """Lines of ~1 KiB of varied prose until ``size_bytes``; returns the line count."""
    words = [
        "river",
        "valley",
        "stone",
        "harvest",
        "weather",
        "village",
        "market",
        "orchard",
        "channel",
        "record",
    ]
    block = b"".join(
        orjson.dumps({"text": " ".join(words[(i * 7 + j) % len(words)] for j in range(150)) + f" {i}"})
        + b"\n"
        for i in range(1000)
    )
    lines = 0
    with open(path, "wb") as f:
        while f.tell() < size_bytes:
            f.write(block)
            lines += 1000
    return lines


def peak_rss() -> int:
    """This process's peak resident memory in bytes.

    ``VmHWM`` rather than ``ru_maxrss``: Linux carries ``ru_maxrss`` over from the parent
    across fork and exec, so a child of a big pytest process would report the parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(jsonl: Path, repo_dir: Path) -> dict[str, int]:
    """Ingest ``jsonl`` into a fresh LocalRepo in this process; peak RSS before and after, in bytes."""
    from tasks.ingest import IngestConfig, SourceConfig, run_ingest
    from tasks.stage import run_stage
    from versioning import open_repo

    repo = open_repo(str(repo_dir))
    source = SourceConfig(name="big", kind="prose", format="jsonl", path=str(jsonl))
    config = IngestConfig(sources=[source], gate={"enabled": False})
    before = peak_rss()
    result = run_stage(run_ingest, repo, "main", repo.resolve("main"), config)
    after = peak_rss()
    return {"peak_before": before, "peak_after": after, "kept": result.report["kept"]}


def run_in_child(size_mib: int, workdir: Path) -> dict[str, int]:
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl = workdir / "big.jsonl"
    lines = write_jsonl(jsonl, size_mib * MiB)
    code = (
        "import json, sys; from pathlib import Path; from tests.tasks.test_ingest_memory import measure; "
        "print(json.dumps(measure(Path(sys.argv[1]), Path(sys.argv[2]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(jsonl), str(workdir / "repo")],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return json.loads(out.stdout.strip().splitlines()[-1]) | {
        "lines": lines,
        "file_bytes": jsonl.stat().st_size,
    }


@pytest.mark.slow
def test_ingest_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    small = run_in_child(64, tmp_path / "small")
    large = run_in_child(256, tmp_path / "large")
    assert (small["kept"], large["kept"]) == (small["lines"], large["lines"])
    growth = {name: r["peak_after"] - r["peak_before"] for name, r in (("small", small), ("large", large))}
    # 192 MiB more input may cost at most a quarter of that in peak memory
    assert growth["large"] - growth["small"] < (large["file_bytes"] - small["file_bytes"]) / 4, (small, large)
    assert large["peak_after"] < 512 * MiB


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as workdir:
        figures = run_in_child(int(sys.argv[1]) if len(sys.argv) > 1 else 2048, Path(workdir))
    print({k: f"{v / MiB:.0f} MiB" if k != "lines" and k != "kept" else v for k, v in figures.items()})
