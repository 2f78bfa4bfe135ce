"""``./dev lakefs``: a user's own lakeFS on MinIO, as the tests run it, kept across restarts.

The command runs as a user runs it (a process, stopped with SIGTERM as Ctrl-C would); tokenlake
reaches it the lakectl way through the file it writes, which holds the only copy of the keys.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flows.services.build import load_pins
from versioning.lakefs import LakeFSRepo

ROOT = Path(__file__).resolve().parents[2]
READY = "Ctrl-C stops both."


def start(workdir: Path, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """The command, once it says it is ready (its stdout lines so far)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.services.local_lakefs", "--dir", str(workdir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.strip() == READY:
            return process, lines
    process.wait()
    pytest.fail(f"./dev lakefs exited {process.returncode} before it was ready:\n" + "\n".join(lines))


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    rest = process.stdout.read()
    assert process.wait(timeout=120) == 0, rest
    return rest


def test_dev_lakefs_serves_tokenlake_the_lakectl_way_and_keeps_its_repositories(tmp_path, monkeypatch):
    workdir = tmp_path / "lakefs"
    process, lines = start(workdir)
    try:
        lakectl = workdir / "lakectl.yaml"
        assert f"  export LAKECTL_CONFIG_FILE={lakectl}" in lines
        assert stat.S_IMODE(lakectl.stat().st_mode) == 0o600
        assert stat.S_IMODE((workdir / "state.json").stat().st_mode) == 0o600
        keys = [line.split(": ", 1)[1] for line in lakectl.read_text().splitlines() if "_key" in line]
        assert len(keys) == 2 and not any(key in "\n".join(lines) for key in keys)  # never printed
        assert lines[0].startswith(f"lakeFS {load_pins()['lakefs'].version} on http://127.0.0.1:")
        for name in (
            "LAKECTL_SERVER_ENDPOINT_URL",
            "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
        ):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(lakectl))
        namespace = next(
            line.split("=", 1)[1] for line in lines if "TOKENLAKE_LAKEFS_STORAGE_NAMESPACE=" in line
        )
        repo = LakeFSRepo.from_lakectl("kept", storage_namespace=f"{namespace}/kept")
        repo.ensure()
        repo.put("main", "data.txt", b"survives a restart")
        committed = repo.commit("main", "before the restart").id
    finally:
        assert "stopped" in stop(process)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _runs_from(p, workdir)]

    process, again = start(workdir)
    try:
        assert again[0] == lines[0]  # the same ports
        repo = LakeFSRepo.from_lakectl("kept")
        assert repo.resolve("main") == committed
        assert repo.get("main", "data.txt") == b"survives a restart"
    finally:
        stop(process)

    refused = subprocess.run(
        [sys.executable, "-m", "flows.services.local_lakefs", "--dir", str(workdir), "--port", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "pass --port" in refused.stderr, refused.stderr


def _runs_from(pid: str, workdir: Path) -> bool:
    """Whether process ``pid`` is a live service started in ``workdir``."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return str(workdir) in command and state != "Z"
