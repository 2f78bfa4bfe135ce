"""lakeFS Actions for the local repository: the pre-merge Lua hooks a lakeFS server would run.

On a merge, lakeFS reads every action file directly under ``_lakefs_actions/`` of the *source*
commit, keeps those whose ``on: pre-merge`` lists no branches or a pattern matching the
destination, runs their hooks, and refuses the merge when one fails (lakeFS
``pkg/actions/service.go``, ``pkg/catalog/actions_source.go``, ``pkg/graveler/graveler.go``).
:func:`check_pre_merge` does the same for :meth:`LocalRepo.merge`, so a repository that holds
an action behaves alike on both backends. Nothing here knows what a hook checks.

A Lua hook runs in a Lua 5.2 interpreter (lupa; lakeFS embeds go-lua, a Lua 5.2) holding what
lakeFS gives a hook (``pkg/actions/lua.go``, ``pkg/actions/lua/``): the ``action`` table of the
event, ``args`` from the action file, and the modules ``lakefs`` (``get_object``,
``stat_object``, ``list_objects``: reads of this repository), ``encoding/json`` and ``hook``.
No ``io``, ``os``, ``debug``, ``package`` or file loading, and no attribute access to Python
objects: a repository's content must not reach the machine. Webhook and Airflow hooks
cannot run here; a matching one refuses the merge, saying so, rather than letting it through.
"""

from __future__ import annotations

import fnmatch
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml

from versioning.port import Commit, HookFailed, NotFound, ObjectStat

ACTIONS_PREFIX = "_lakefs_actions/"
_LUA_MEMORY = 64 << 20  # bytes a hook's interpreter may allocate
_FAILURE_OPEN, _FAILURE_CLOSE = "<HookFailure>", "</HookFailure>"

# Installed into every hook's interpreter: the lakeFS modules as Lua tables around Python
# reads, `require` limited to them, and the unsafe parts of the standard library removed.
_PRELUDE = """
local modules, python_json, python_lakefs = ...
modules["encoding/json"] = {
  unmarshal = function(text) return python_json.unmarshal(text) end,
  marshal = function(value) return python_json.marshal(value) end,
}
modules["hook"] = {
  fail = function(message) error("<HookFailure>" .. tostring(message) .. "</HookFailure>", 2) end,
}
modules["lakefs"] = {
  get_object = function(repo, ref, path) return python_lakefs.get_object(repo, ref, path) end,
  stat_object = function(repo, ref, path) return python_lakefs.stat_object(repo, ref, path) end,
  list_objects = function(repo, ref, after, prefix, delimiter, amount)
    return python_lakefs.list_objects(repo, ref, after or "", prefix or "", delimiter or "", amount or 100)
  end,
}
require = function(name)
  local found = modules[name]
  if found == nil then
    error("module '" .. tostring(name) .. "' is not available to hooks run by the local repository", 2)
  end
  return found
end
io, os, debug, package, dofile, loadfile, python = nil, nil, nil, nil, nil, nil, nil
string.dump = nil
"""


class RepositoryReader(Protocol):
    """What a hook may read: :class:`~versioning.local.repo.LocalRepo` provides it."""

    name: str

    def resolve(self, ref: str) -> str: ...
    def get(self, ref: str, path: str) -> bytes: ...
    def stat(self, ref: str, path: str) -> ObjectStat: ...
    def list(self, ref: str, prefix: str = "") -> Any: ...
    def get_commit(self, ref: str) -> Commit: ...


@dataclass(frozen=True)
class MergeEvent:
    """A merge about to happen: what lakeFS's hook record holds for ``pre-merge``."""

    source_commit: str
    destination: str
    destination_head: str
    message: str
    metadata: dict[str, str]


def check_pre_merge(repo: RepositoryReader, event: MergeEvent) -> bool:
    """Run the pre-merge hooks of the actions in the source commit; raise :class:`HookFailed` when
    one refuses. Returns whether any hook ran (the caller then checks the heads did not move)."""
    ran = False
    for path, action in _actions(repo, event.source_commit):
        if not _matches(action, event.destination):
            continue
        name = str(action.get("name") or path)
        for hook in action.get("hooks") or []:
            hook_id = str(hook.get("id", "?"))
            if hook.get("type") != "lua":
                raise HookFailed(
                    f"pre-merge hook aborted: action {name!r} hook {hook_id!r} is of type "
                    f"{hook.get('type')!r}, which only a lakeFS server can run; the local repository "
                    "refuses the merge rather than skip it"
                )
            _run_lua(repo, event, name, hook_id, hook.get("properties") or {})
            ran = True
    return ran


def _actions(repo: RepositoryReader, commit: str) -> list[tuple[str, dict[str, Any]]]:
    """The action files directly under ``_lakefs_actions/`` (lakeFS lists with a ``/`` delimiter)."""
    found = []
    for stat in repo.list(commit, ACTIONS_PREFIX):
        if "/" in stat.path[len(ACTIONS_PREFIX) :]:
            continue
        try:
            action = yaml.safe_load(repo.get(commit, stat.path))
        except yaml.YAMLError as exc:
            raise HookFailed(
                f"pre-merge hook aborted: action file {stat.path} is not valid YAML ({exc})"
            ) from None
        if not isinstance(action, dict):
            raise HookFailed(f"pre-merge hook aborted: action file {stat.path} is not an action (a mapping)")
        found.append((stat.path, action))
    return found


def _matches(action: dict[str, Any], destination: str) -> bool:
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean true; lakeFS's Go parser reads a string
    events = action.get("on", action.get(True)) or {}
    if "pre-merge" not in events:
        return False
    branches = (events.get("pre-merge") or {}).get("branches") or []
    # lakeFS matches with Go's path.Match: `*` stays within one path segment, like fnmatch here
    # for branch names (which hold no '/').
    return not branches or any(fnmatch.fnmatchcase(destination, str(b)) for b in branches)


def _run_lua(
    repo: RepositoryReader, event: MergeEvent, action_name: str, hook_id: str, properties: dict[str, Any]
) -> None:
    from lupa.lua52 import LuaError, LuaRuntime

    script = properties.get("script")
    if script is None and properties.get("script_path"):
        try:  # lakeFS loads script_path from the source ref too
            script = repo.get(event.source_commit, str(properties["script_path"])).decode()
        except NotFound:
            raise HookFailed(
                f"pre-merge hook aborted: action {action_name!r} hook {hook_id!r}: could not load "
                f"script_path {properties['script_path']} (not found at the source commit)"
            ) from None
    if not isinstance(script, str):
        raise HookFailed(f"pre-merge hook aborted: action {action_name!r} hook {hook_id!r} has no script")

    lua = LuaRuntime(
        register_eval=False,
        register_builtins=False,
        unpack_returned_tuples=True,
        attribute_filter=_no_attributes,
        max_memory=_LUA_MEMORY,
    )
    bridge = _Bridge(lua, repo)
    lua.execute(_PRELUDE, lua.table(), bridge.json_module(), bridge.lakefs_module())
    globals_ = lua.globals()
    globals_.action = bridge.to_lua(_action_table(repo, event, action_name, hook_id))
    globals_.args = bridge.to_lua(properties.get("args") or {})
    try:
        lua.execute(script)
    except LuaError as exc:
        text = str(exc)
        if _FAILURE_OPEN in text:
            text = text.split(_FAILURE_OPEN, 1)[1].split(_FAILURE_CLOSE, 1)[0]
        raise HookFailed(f"pre-merge hook aborted: action {action_name!r} hook {hook_id!r}: {text}") from None


def _action_table(
    repo: RepositoryReader, event: MergeEvent, action_name: str, hook_id: str
) -> dict[str, Any]:
    """The ``action`` global, field for field as lakeFS's ``applyRecord`` builds it."""
    return {
        "action_name": action_name,
        "hook_id": hook_id,
        "run_id": secrets.token_hex(10),
        "pre_run_id": "",
        "event_type": "pre-merge",
        "commit_id": "",
        "branch_id": event.destination,
        "source_ref": event.source_commit,
        "tag_id": "",
        "repository_id": repo.name,
        "storage_namespace": f"local://{repo.name}",
        "commit": {
            "message": event.message,
            "meta_range_id": "",
            "creation_date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "version": 1,
            "metadata": dict(event.metadata),
            "parents": [event.destination_head, event.source_commit],
        },
    }


def _no_attributes(obj: object, name: str, is_setting: bool) -> str:
    raise AttributeError(f"hooks may not read or set attributes of host objects ({name!r})")


class _Bridge:
    """Python halves of the Lua modules; every answer is a Lua value, never a Python object."""

    def __init__(self, lua: Any, repo: RepositoryReader):
        self.lua = lua
        self.repo = repo

    def to_lua(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self.lua.table_from({str(k): self.to_lua(v) for k, v in value.items() if v is not None})
        if isinstance(value, (list, tuple)):
            return self.lua.table_from([self.to_lua(v) for v in value])
        return value

    def from_lua(self, value: Any) -> Any:
        if self.lua_type(value) != "table":
            return value
        items = dict(value.items())
        if (
            items
            and all(isinstance(k, int) for k in items)
            and sorted(items) == list(range(1, len(items) + 1))
        ):
            return [self.from_lua(items[i]) for i in range(1, len(items) + 1)]
        return {str(k): self.from_lua(v) for k, v in items.items()}

    def lua_type(self, value: Any) -> str | None:
        from lupa.lua52 import lua_type

        return lua_type(value)

    def json_module(self) -> Any:
        def unmarshal(text: Any) -> Any:
            return self.to_lua(json.loads(text))

        def marshal(value: Any) -> str:
            return json.dumps(self.from_lua(value))

        return self.lua.table_from({"unmarshal": unmarshal, "marshal": marshal})

    def lakefs_module(self) -> Any:
        """Reads as lakeFS's Lua client answers them (status code first; ``pkg/actions/lua/lakefs/client.go``)."""

        def get_object(repository: str, ref: str, path: str) -> tuple[int, bytes | str]:
            if repository != self.repo.name:
                return 404, json.dumps({"message": f"repository {repository} not found"})
            try:
                return 200, self.repo.get(self._ref(ref), path)
            except NotFound as exc:
                return 404, json.dumps({"message": str(exc)})

        def stat_object(repository: str, ref: str, path: str) -> tuple[int, str]:
            if repository != self.repo.name:
                return 404, json.dumps({"message": f"repository {repository} not found"})
            try:
                stat = self.repo.stat(self._ref(ref), path)
            except NotFound as exc:
                return 404, json.dumps({"message": str(exc)})
            return 200, json.dumps(
                {"path": stat.path, "path_type": "object", "checksum": stat.checksum, "size_bytes": stat.size,
                 "mtime": int(stat.mtime)}
            )  # fmt: skip

        def list_objects(
            repository: str, ref: str, after: str, prefix: str, delimiter: str, amount: int
        ) -> Any:
            if repository != self.repo.name:
                return 404, self.to_lua({"message": f"repository {repository} not found"})
            try:
                stats = [s for s in self.repo.list(self._ref(ref), prefix) if s.path > after]
            except NotFound as exc:
                return 404, self.to_lua({"message": str(exc)})
            results, prefixes = [], []
            for stat in stats:
                rest = stat.path[len(prefix) :]
                if delimiter and delimiter in rest:
                    common = prefix + rest.split(delimiter, 1)[0] + delimiter
                    if common not in prefixes:
                        prefixes.append(common)
                        results.append({"path": common, "path_type": "common_prefix"})
                else:
                    results.append(
                        {
                            "path": stat.path,
                            "path_type": "object",
                            "checksum": stat.checksum,
                            "size_bytes": stat.size,
                        }
                    )
            page = results[: int(amount)]
            has_more = len(results) > len(page)
            pagination = {"has_more": has_more, "next_offset": page[-1]["path"] if has_more else "",
                          "results": len(page), "max_per_page": int(amount)}  # fmt: skip
            return 200, self.to_lua({"pagination": pagination, "results": page})

        return self.lua.table_from(
            {"get_object": get_object, "stat_object": stat_object, "list_objects": list_objects}
        )

    def _ref(self, ref: str) -> str:
        return self.repo.resolve(ref)
