"""Full disks: a write that runs out of room fails with one sentence naming the path and the
space it needs, leaves nothing half-written that a later run would trust, never moves main,
and once there is room again the same work succeeds.

Two ways to run out of room: a real file-size limit (``RLIMIT_FSIZE`` in a subprocess, with
``SIGXFSZ`` ignored, so the kernel answers ``EFBIG``), and an ``OSError(ENOSPC)`` injected at
the write layer where a subprocess cannot isolate the one write (the shard stage's files, a
lineage repository that is out of space).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest

from formats.layout import LINEAGE_BRANCH, checkpoint_record_path
from tasks.shard.stage import run_shard
from tasks.stage import run_stage
from tests.tasks.test_shard_stage import SMALL, build_dedup_repo, shard_on_branch
from tests.training.helpers import ROOT, make_config, make_dataset, torchrun_command
from training.checkpoint import newest_valid
from training.config import CheckpointConfig
from training.lineage import LineageWriter
from training.metrics import read_metrics
from training.trainer import train
from versioning import DiskFull
from versioning.local import LocalRepo

MiB = 1 << 20


def run_with_file_limit(argv: list[str], limit_bytes: int) -> subprocess.CompletedProcess:
    """Run ``argv`` with every file it writes capped at ``limit_bytes``."""

    def cap_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        argv, cwd=ROOT, preexec_fn=cap_file_size,
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def fresh_repo(root) -> LocalRepo:
    repo = LocalRepo(root)
    repo.ensure()
    repo.put("main", "README", b"a dataset repository\n")
    repo.commit("main", "first", {})
    repo.create_branch("work", "main")
    return repo


def test_an_object_write_past_the_file_limit_names_the_store_and_leaves_no_object(tmp_path):
    repo = fresh_repo(tmp_path / "repo")
    heads = repo.list_branches()
    big = os.urandom(MiB)
    (tmp_path / "big.bin").write_bytes(big)
    out = run_with_file_limit(python(
        """
        import sys
        from versioning import DiskFull
        from versioning.local import LocalRepo
        repo = LocalRepo(sys.argv[1])
        for source in (open(sys.argv[2], "rb").read(), sys.argv[2]):  # bytes, then a file path
            try:
                repo.put("work", "big.bin", source)
            except DiskFull as exc:
                print(exc)
        """,
        str(repo.root), str(tmp_path / "big.bin"),
    ), 256 << 10)  # fmt: skip
    assert out.returncode == 0, out.stderr
    messages = out.stdout.splitlines()
    assert len(messages) == 2
    for message in messages:
        assert message.startswith(
            f"storing 'big.bin' on branch 'work': no space left to write an object to the repository's "
            f"object store {repo.root}/objects:"
        )
        assert "it needs 1.0 MiB" in message and "files are limited to 256.0 KiB (ulimit -f)" in message
    assert list((repo.root / "objects" / "tmp").iterdir()) == []  # no half-written object
    assert not repo.exists("work", "big.bin") and repo.list_branches() == heads

    repo.put("work", "big.bin", big)  # room again: the same write succeeds
    repo.commit("work", "big", {})
    assert repo.get("work", "big.bin") == big and repo.resolve("main") == heads["main"]


def test_an_object_write_on_a_full_file_system_says_what_is_free(tmp_path, monkeypatch):
    repo = fresh_repo(tmp_path / "repo")
    written = []

    def full_after_half(fd, view):
        os.write(fd, view[: len(view) // 2])
        written.append(len(view) // 2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("versioning.local.objects._write_all", full_after_half)
    with pytest.raises(DiskFull) as full:
        repo.put("work", "big.bin", b"x" * (2 * MiB))
    assert written == [MiB]
    message = str(full.value)
    assert f"{repo.root}/objects: it needs 2.0 MiB, " in message and " free on that file system" in message
    assert list((repo.root / "objects" / "tmp").iterdir()) == []


def test_a_shard_write_on_a_full_disk_fails_the_stage_and_a_rerun_succeeds(tmp_path, monkeypatch):
    repo, input_commit = build_dedup_repo(tmp_path / "repo")
    main = repo.resolve("main")

    def disk_full(self, rows):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("formats.shards.ShardWriter.write", disk_full)
    with pytest.raises(DiskFull) as full:
        shard_on_branch(repo, input_commit, "curate-full")
    message = str(full.value)
    assert message.startswith("no space left to write the shards of source ") and "it needs " in message
    work = message.split(" to ", 1)[1].split(":", 1)[0]
    assert not os.path.exists(work), "the stage's local work directory is gone"
    assert repo.resolve("curate-full") == main, "no stage commit"
    assert not any(s.path.startswith("shards/") and s.path.endswith(".bin") for s in repo.list("curate-full"))

    monkeypatch.undo()  # room again
    again = run_stage(run_shard, repo, "curate-full", input_commit, SMALL, flow_run_id="test-run")
    clean = shard_on_branch(repo, input_commit, "curate-clean")
    assert repo.get(again.commit_id, "shards/manifest.json") == repo.get(
        clean.commit_id, "shards/manifest.json"
    )
    assert repo.resolve("main") == main


def test_a_lineage_record_that_does_not_fit_is_not_queued_and_is_written_with_room(tmp_path):
    repo = fresh_repo(tmp_path / "repo")
    main = repo.resolve("main")
    queue = tmp_path / "queue"
    out = run_with_file_limit(python(
        """
        import sys
        from pathlib import Path
        from formats.layout import checkpoint_record_path
        from training.lineage import LineageWriter
        from versioning import DiskFull
        writer = LineageWriter(lambda: None, "r", Path(sys.argv[1]))
        try:
            writer.record(checkpoint_record_path("r", 8), {"step": 8, "notes": "x" * 8000})
        except DiskFull as exc:
            print(exc)
        """,
        str(queue),
    ), 4096)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        f"no space left to write the lineage record runs/r/checkpoints/step-0000008.json to {queue}:"
    )
    assert "it needs 7.9 KiB" in out.stdout and "ulimit -f" in out.stdout
    assert list(queue.iterdir()) == [], "no partial record in the queue"

    writer = LineageWriter(lambda: LocalRepo(repo.root), "r", queue)
    writer.record(checkpoint_record_path("r", 8), {"step": 8, "notes": "x" * 8000})
    assert writer.close() is True
    assert json.loads(repo.get(LINEAGE_BRANCH, checkpoint_record_path("r", 8)))["step"] == 8
    assert repo.resolve("main") == main


def test_a_repository_out_of_space_keeps_lineage_records_queued_and_says_so(tmp_path):
    def out_of_space():
        raise DiskFull("no space left to write an object to the repository's object store /x/objects: ...")

    warnings = []
    writer = LineageWriter(out_of_space, "r", tmp_path / "queue", warn=warnings.append)
    writer.record(checkpoint_record_path("r", 4), {"step": 4})
    assert writer.flush() is False and len(writer.pending()) == 1
    assert warnings[0].startswith("lineage: repository out of space, 1 record(s) queued (no space left")


@pytest.mark.slow
def test_a_checkpoint_save_past_the_file_limit_fails_the_run_and_the_resume_succeeds(tmp_path):
    dataset = make_dataset(tmp_path)
    fast = dict(checkpoint=CheckpointConfig(every=1), eval_every=0)
    train(make_config(dataset, "full-disk", steps=1, **fast))  # checkpoints 0 and 1
    config = make_config(dataset, "full-disk", steps=2, **fast)
    command = torchrun_command(config, 1)  # writes the config file the trainer reads
    out = run_with_file_limit(
        [sys.executable, "-m", "training", *command[command.index("--config") :]], 200 << 10
    )
    assert out.returncode == 2, out.stderr[-3000:]
    checkpoints = config.run_dir() / "checkpoints"
    error = next(line for line in out.stderr.splitlines() if line.startswith("training: error:"))
    assert f"no space left to write checkpoint step 2 to {checkpoints}: it needs " in error
    assert "ulimit -f" in error
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step-0000000",
        "step-0000001",
    ]  # nothing partial
    assert newest_valid(checkpoints).step == 1

    result = train(config)  # room again: resumes from step 1 and finishes
    assert result.step == 2
    resumes = [r["step"] for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "resume"]
    assert resumes == [0, 1, 1]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-0000000", "step-0000001", "step-0000002"]
