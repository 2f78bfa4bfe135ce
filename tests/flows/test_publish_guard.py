"""main guarded by the repository itself: the publish guard's Lua hook, run three ways.

1. In an embedded Lua 5.2 (lupa) with the ``action`` table and the lakeFS Lua modules stubbed
   here as lakeFS documents them (docs: howto/hooks/lua.md; ``pkg/actions/lua.go`` builds
   ``action``; ``lakefs.get_object`` answers ``status, body``; ``hook.fail`` aborts).
2. By the local repository's merge, which runs the action it finds in the source commit.
3. By the lakeFS API double (the real SDK over HTTP), which answers a refused merge with 412.
"""

from __future__ import annotations

import argparse
import json

import lupa.lua52 as lua52
import pytest
import yaml

from flows import publish_guard
from flows.commands import repo as repo_command
from flows.commands.repo import run_install_hooks
from tests.versioning.lakefs_backends import double_backend
from versioning import DataRepo, HookFailed
from versioning.local import LocalRepo

SOURCE = "c0ffee" * 10 + "abcd"
MAIN_HEAD = "facade" * 10 + "1234"
GATED = {"ingest": "passed", "validate": "passed", "shard": "passed"}


def passed_report(stage: str) -> bytes:
    return json.dumps({"stage": stage, "expectations": {"success": True, "summary": "passed 9/9"}}).encode()


def publish_metadata(source: str = SOURCE, gates: dict[str, str] = GATED) -> dict[str, str]:
    """What flows.wap.publish records on the merge commit."""
    return {
        "stage": "publish",
        "input_commit": source,
        "gate": "passed",
        "gates": json.dumps(gates),
        "tag": "ds-1",
    }


class LakeFSLuaStubs:
    """The lakeFS Lua environment of one pre-merge event, stubbed from lakeFS's documentation."""

    def __init__(self, objects: dict[tuple[str, str], bytes], metadata: dict[str, str], branch: str = "main"):
        self.objects = objects
        self.reads: list[tuple[str, str, str]] = []
        self.lua = lua52.LuaRuntime(unpack_returned_tuples=True)
        g = self.lua.globals()
        g.action = self.lua.table_from(
            {
                "action_name": "tokenlake publish guard",
                "hook_id": "publish_gates",
                "event_type": "pre-merge",
                "repository_id": "datasets",
                "branch_id": branch,
                "source_ref": SOURCE,
                "commit_id": "",
                "commit": self.lua.table_from(
                    {
                        "message": "publish ds-1",
                        "metadata": self.lua.table_from(metadata),
                        "parents": self.lua.table_from([MAIN_HEAD, SOURCE]),
                    }
                ),
            }
        )
        action = yaml.safe_load(publish_guard.guard_files()[publish_guard.ACTION_PATH])
        stages = action["hooks"][0]["properties"]["args"]["gated_stages"]
        g.args = self.lua.table_from({"gated_stages": self.lua.table_from(stages)})
        preload = g.package.preload
        preload["lakefs"] = self.lua.eval(
            "function(get) return function() return {get_object = get} end end"
        )(self.get_object)
        preload["encoding/json"] = self.lua.eval(
            "function(decode) return function() return {unmarshal = decode} end end"
        )(self.unmarshal)
        preload["hook"] = self.lua.eval(  # lakeFS: lua.Errorf(l, "<HookFailure>%s</HookFailure>", message)
            'function() return {fail = function(m) error("<HookFailure>" .. m .. "</HookFailure>") end} end'
        )

    def get_object(self, repository: str, ref: str, path: str) -> tuple[int, bytes]:
        """lakefs/get_object: the HTTP status code, then the object's content."""
        self.reads.append((repository, ref, path))
        data = self.objects.get((ref, path))
        return (200, data) if data is not None else (404, b'{"message": "not found"}')

    def unmarshal(self, text: str):
        def to_lua(value):
            if isinstance(value, dict):
                return self.lua.table_from({k: to_lua(v) for k, v in value.items() if v is not None})
            if isinstance(value, list):
                return self.lua.table_from([to_lua(v) for v in value])
            return value

        return to_lua(json.loads(text))

    def run(self) -> str | None:
        """The hook's failure message, or None when it lets the merge through."""
        script = publish_guard.guard_files()[publish_guard.SCRIPT_PATH].decode()
        try:
            self.lua.execute(script)
        except lua52.LuaError as error:
            text = str(error)
            assert "<HookFailure>" in text, f"the hook crashed instead of failing: {text}"
            return text.split("<HookFailure>", 1)[1].split("</HookFailure>", 1)[0]
        return None


def reports(ref: str = SOURCE, **overrides: bytes) -> dict[tuple[str, str], bytes]:
    found = {(ref, f"reports/{stage}.json"): passed_report(stage) for stage in GATED}
    found.update({(ref, f"reports/{stage}.json"): data for stage, data in overrides.items()})
    return found


def test_lua_lets_a_merge_through_when_every_stage_gate_passed():
    stubs = LakeFSLuaStubs(reports(), publish_metadata())
    assert stubs.run() is None
    assert sorted(path for _, _, path in stubs.reads) == [f"reports/{s}.json" for s in sorted(GATED)]
    assert {(repo, ref) for repo, ref, _ in stubs.reads} == {("datasets", SOURCE)}


def test_lua_refuses_an_ungated_merge_with_a_message_naming_each_gap():
    message = LakeFSLuaStubs(reports(), {}).run()  # e.g. `lakectl merge` of a hand-made branch
    assert message.startswith("merge into main refused by the tokenlake publish guard")
    for gap in ("input_commit is nil", "publish gates are not recorded as passed", "ingest gate is not recorded",
                "validate gate is not recorded", "shard gate is not recorded", "tokenlake curate"):  # fmt: skip
        assert gap in message


@pytest.mark.parametrize(
    ("metadata", "objects", "gap"),
    [
        (publish_metadata(gates={**GATED, "validate": "failed"}), reports(), "the validate gate is failed"),
        (publish_metadata(gates={**GATED, "ingest": "disabled"}), reports(), "the ingest gate is disabled"),
        (publish_metadata(source="0" * 64), reports(), "does not name the merged commit"),  # a stale record
        ({**publish_metadata(), "gate": "failed"}, reports(), "publish gates are not recorded as passed"),
        ({**publish_metadata(), "gates": "not json"}, reports(), "gates metadata is not a JSON object"),
        (
            publish_metadata(),
            reports(shard=b'{"expectations": {"success": false}}'),
            "shard.json at the merged",
        ),
        (publish_metadata(), reports(ingest=b'{"expectations": null}'), "ingest.json at the merged"),
        (publish_metadata(), reports(ref="elsewhere"), "reports/ingest.json is missing at the merged commit"),
    ],
)
def test_lua_refuses_each_missing_or_failed_gate(metadata, objects, gap):
    message = LakeFSLuaStubs(objects, metadata).run()
    assert message is not None and gap in message


def test_the_action_guards_main_on_pre_merge_and_loads_the_script_it_ships_with():
    action = yaml.safe_load(publish_guard.guard_files()[publish_guard.ACTION_PATH])
    events = action.get("on", action.get(True))  # YAML 1.1 reads the key `on` as true
    assert events == {"pre-merge": {"branches": ["main"]}}
    (hook,) = action["hooks"]
    assert hook["type"] == "lua" and hook["properties"]["script_path"] == publish_guard.SCRIPT_PATH
    assert set(hook["properties"]["args"]["gated_stages"]) == set(GATED)


def gated_branch(repo: DataRepo, branch: str, gates: dict[str, str] = GATED) -> str:
    """A branch from main with new data and each gated stage's commit and report."""
    repo.create_branch(branch, "main")
    repo.put(branch, "shards/web/shard-00000.bin", b"tokens")
    for stage, verdict in gates.items():
        repo.put(branch, f"reports/{stage}.json", passed_report(stage))
        repo.commit(branch, stage, {"stage": stage, "gate": verdict})
    return repo.resolve(branch)


@pytest.fixture
def guarded(tmp_path) -> LocalRepo:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    assert publish_guard.install(repo) is not None
    assert publish_guard.install(repo) is None  # installing again changes nothing
    return repo


def test_the_local_repository_refuses_the_same_ungated_merge(guarded):
    guarded.create_branch("hand-made", "main")
    guarded.put("hand-made", "shards/web/shard-00000.bin", b"unchecked tokens")
    guarded.commit("hand-made", "upload shards by hand")
    before = guarded.resolve("main")
    with pytest.raises(HookFailed, match="refused by the tokenlake publish guard") as refused:
        guarded.merge("hand-made", "main", "merge by hand")
    assert "action 'tokenlake publish guard' hook 'publish_gates'" in str(refused.value)
    assert guarded.resolve("main") == before


def test_the_local_repository_merges_a_gated_run(guarded):
    head = gated_branch(guarded, "curate-1")
    merged = guarded.merge("curate-1", "main", "publish ds-1", publish_metadata(source=head))
    assert (
        guarded.resolve("main") == merged and guarded.get("main", "shards/web/shard-00000.bin") == b"tokens"
    )


def test_the_local_repository_reads_actions_from_the_source_commit_and_only_for_matching_branches(guarded):
    head = gated_branch(guarded, "curate-1")
    guarded.create_branch("staging", "main")  # the action names main only
    guarded.merge("curate-1", "staging", "try it")
    before_guard = list(guarded.log("main"))[-1].id
    guarded.create_branch("old", before_guard)
    guarded.put("old", "notes.txt", b"no action in this commit")
    guarded.commit("old", "notes")
    guarded.merge("old", "main", "an action is read from the source, as lakeFS does")
    assert guarded.resolve("main") != head


def test_the_local_repository_gives_hooks_the_lakefs_action_table_and_no_host_access(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.put("main", "_lakefs_actions/probe.yaml", yaml.safe_dump({
        "name": "probe", "on": {"pre-merge": {"branches": ["ma*"]}},
        "hooks": [{"id": "dump", "type": "lua", "properties": {"script": PROBE, "args": {"k": ["v"]}}}],
    }).encode())  # fmt: skip
    repo.commit("main", "install a probe")
    repo.create_branch("dev", "main")
    repo.put("dev", "x.txt", b"x")
    source = repo.commit("dev", "x").id
    head = repo.resolve("main")
    with pytest.raises(HookFailed) as probed:
        repo.merge("dev", "main", "probe it", {"k": "v"})
    seen = json.loads(str(probed.value).split("hook 'dump': ", 1)[1])
    assert seen["action"]["event_type"] == "pre-merge" and seen["action"]["branch_id"] == "main"
    assert seen["action"]["source_ref"] == source and seen["action"]["repository_id"] == repo.name
    assert seen["action"]["commit"]["parents"] == [head, source] and seen["action"]["commit"]["metadata"] == {
        "k": "v"
    }
    assert seen["args"] == {"k": ["v"]} and seen["x"] == "x"
    assert seen["sandbox"] == {"io": "nil", "os": "nil", "python": "nil", "require_os": "refused"}


PROBE = """
local json = require("encoding/json")
local lakefs = require("lakefs")
local code, body = lakefs.get_object(action.repository_id, action.source_ref, "x.txt")
local refused = pcall(require, "os") and "allowed" or "refused"
local sandbox = {io = type(io), os = type(os), python = type(python), require_os = refused}
error(json.marshal({action = action, args = args, x = body, sandbox = sandbox}), 0)
"""


def test_a_hook_only_lakefs_can_run_refuses_the_local_merge(tmp_path):
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    repo.put("main", "_lakefs_actions/web.yaml", yaml.safe_dump({
        "name": "notify", "on": {"pre-merge": None},
        "hooks": [{"id": "ci", "type": "webhook", "properties": {"url": "http://ci.example/hook"}}],
    }).encode())  # fmt: skip
    repo.commit("main", "install a webhook")
    repo.create_branch("dev", "main")
    repo.put("dev", "x.txt", b"x")
    repo.commit("dev", "x")
    with pytest.raises(HookFailed, match="only a lakeFS server can run"):
        repo.merge("dev", "main")


def test_install_hooks_over_the_lakefs_api_and_an_ungated_merge_answered_412(tmp_path, capsys, monkeypatch):
    with double_backend(tmp_path) as repo:
        repo.ensure()
        monkeypatch.setattr(repo_command, "_open", lambda args: repo)
        assert run_install_hooks(argparse.Namespace(json=True)) == 0
        installed = json.loads(capsys.readouterr().out)
        assert installed["commit"] == repo.resolve("main")
        assert sorted(installed["paths"]) == sorted(publish_guard.guard_files())
        assert publish_guard.missing_files(repo) == []
        repo.create_branch("hand-made", "main")
        repo.put("hand-made", "shards/web/shard-00000.bin", b"unchecked tokens")
        repo.commit("hand-made", "upload by hand")
        with pytest.raises(HookFailed, match="refused by the tokenlake publish guard"):
            repo.merge("hand-made", "main", "merge by hand")
        head = gated_branch(repo, "curate-1")
        repo.merge("curate-1", "main", "publish ds-1", publish_metadata(source=head))
        assert repo.get("main", "shards/web/shard-00000.bin") == b"tokens"
