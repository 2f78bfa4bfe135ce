"""The publish guard inside a real lakeFS: lakeFS itself runs the Lua hook and refuses the merge.

``tokenlake repo install-hooks`` (the CLI, as a user runs it, on ``lakefs://``) uploads the action
and its script; then lakeFS v1.84.0 (``tests/lakefs_real``) runs the script in its own Lua on
every merge into ``main``: an ungated merge is refused with the hook's sentence, a gated publish
merges, and a hook that errors (its script broken) refuses too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from flows import publish_guard
from tests.flows.test_publish_guard import gated_branch, publish_metadata
from tests.lakefs_real import real_lakefs
from versioning import HookFailed


@pytest.fixture
def guarded(tmp_path):
    server = real_lakefs()
    name = f"hook-{uuid.uuid4().hex[:12]}"
    repo = server.connect(name)
    repo.ensure()
    env = server.lakectl_environment() | {
        "LAKECTL_CONFIG_FILE": str(tmp_path / "no-lakectl.yaml"),
        "TOKENLAKE_HOME": str(tmp_path / "home"),
    }
    installed = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--repo", f"lakefs://{name}", "repo", "install-hooks", "--json"],
        env=os.environ | env,
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    assert json.loads(installed.stdout)["commit"] == repo.resolve("main")
    assert publish_guard.missing_files(repo) == []
    yield repo
    repo._repo.delete()


def test_lakefs_itself_refuses_an_ungated_merge_with_the_hooks_sentence(guarded):
    guarded.create_branch("hand-made", "main")
    guarded.put("hand-made", "shards/web/shard-00000.bin", b"unchecked tokens")
    guarded.commit("hand-made", "upload shards by hand")
    before = guarded.resolve("main")
    with pytest.raises(HookFailed) as refused:
        guarded.merge("hand-made", "main", "merge by hand")
    message = str(refused.value)
    assert "merge into main refused by the tokenlake publish guard" in message
    assert "the ingest gate is not recorded" in message and "(tokenlake curate)" in message
    assert "\n" not in message and "Traceback" not in message
    assert guarded.resolve("main") == before


def test_lakefs_merges_a_gated_publish(guarded):
    head = gated_branch(guarded, "curate-1")
    merged = guarded.merge("curate-1", "main", "publish ds-1", publish_metadata(source=head))
    assert guarded.resolve("main") == merged
    assert guarded.get("main", "shards/web/shard-00000.bin") == b"tokens"
    assert guarded.get_commit(merged).metadata["input_commit"] == head


def test_a_gate_recorded_as_failed_is_refused_by_lakefs(guarded):
    head = gated_branch(
        guarded, "curate-1", gates={"ingest": "passed", "validate": "failed", "shard": "passed"}
    )
    gates = {"ingest": "passed", "validate": "failed", "shard": "passed"}
    with pytest.raises(HookFailed, match="the validate gate is failed"):
        guarded.merge("curate-1", "main", "publish", publish_metadata(source=head, gates=gates))


def test_a_hook_that_errors_fails_closed(guarded):
    # A broken script on the merged branch (lakeFS reads actions and scripts from the source
    # commit): a Lua error, not hook.fail, and lakeFS still refuses the merge.
    guarded.create_branch("broken", "main")
    guarded.put("broken", publish_guard.SCRIPT_PATH, b"local x = nil\nreturn x.field\n")
    guarded.put("broken", "shards/web/shard-00000.bin", b"tokens")
    head = guarded.commit("broken", "a broken guard script").id
    before = guarded.resolve("main")
    with pytest.raises(HookFailed):
        guarded.merge("broken", "main", "publish", publish_metadata(source=head))
    assert guarded.resolve("main") == before
