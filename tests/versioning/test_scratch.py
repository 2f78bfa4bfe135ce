"""Scratch named by its owner (versioning/scratch.py): what a dead process of this host left is
found and removed, never a live owner's, never another host's, on real processes."""

import os
import subprocess
import sys
import time

from versioning.scratch import HOST, leftovers, owned_prefix, sweep


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_owners_folder_and_file_go_a_live_owners_and_other_kinds_stay(tmp_path):
    pid = dead_pid()
    made = int(time.time())
    dead_dir = tmp_path / f"tokenlake-loader-{HOST}-{pid}-{made}-node0-1"
    (dead_dir / "inner").mkdir(parents=True)
    (dead_dir / "inner" / "rows.arrow").write_bytes(b"x" * 100)
    dead_file = tmp_path / f"tokenlake-loader-{HOST}-{pid}-{made}-node0-1.commit.json"
    dead_file.write_text("{}")
    live = tmp_path / f"{owned_prefix('loader')}node0-2"
    live.write_text("mine")
    other_kind = tmp_path / f"tokenlake-dedup-out-{HOST}-{pid}-{made}-abc"
    other_kind.mkdir()
    other_host = tmp_path / f"tokenlake-loader-0123abcd-{pid}-{made}-node0-3"
    other_host.write_text("theirs")
    unrelated = tmp_path / "tokenlake-loader-node0-1-2"  # no owner in its name: not ours to judge
    unrelated.write_text("?")

    found = {(p.path.name, p.pid, p.bytes) for p in leftovers(tmp_path, "loader")}
    assert found == {(dead_dir.name, pid, 100), (dead_file.name, pid, 2)}
    assert {p.kind for p in leftovers(tmp_path)} == {"loader", "dedup-out"}

    removed = sweep(tmp_path, "loader")
    assert sorted(p.path for p in removed) == sorted([dead_dir, dead_file])
    assert not dead_dir.exists() and not dead_file.exists()
    assert live.exists() and other_kind.exists() and other_host.exists() and unrelated.exists()


def test_a_pid_reused_since_the_name_was_made_is_not_the_owner(tmp_path):
    an_hour_before_this_process = int(time.time()) - 3600
    reused = tmp_path / f"tokenlake-loader-{HOST}-{os.getpid()}-{an_hour_before_this_process}-node0-1"
    reused.write_text("left")
    assert [p.path for p in sweep(tmp_path, "loader")] == [reused]
