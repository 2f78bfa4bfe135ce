"""The curate stages' cache: key = (stage, repository, input commit id, stage-config hash, code version).

A stage reads its input at an immutable commit id, so a result keyed on that id, on the hash
of the stage's config and on the version of the stage's code is exact: the same key can only
ever mean the same output. The code version is a hash of the source files the stage runs
(:func:`stage_code_version`), as Prefect's own default cache policy includes a task's source;
editing a stage re-runs it and, since its commit changes, every stage after it. Two inputs
are not commits and are folded into the key as fingerprints:

* ingest reads nothing from the repository: its input is the source files, so its key is
  every selected file's path, size and modification time (as ``make`` and ``rsync`` judge
  freshness; content is not re-read) instead of a commit id;
* safety reads the benchmark and blocklist files the user names: their content is hashed;
* shard may reuse the tokenizer of another dataset ref (``reuse_tokenizer_from``), which is
  resolved to its commit id, so moving that ref invalidates the key.

Results are persisted (pickled ``StageResult``) in a directory outside Prefect's database, by
default ``<data home>/results``, so a new process, a retried flow run or a re-run from the UI
finds them. Whether a cached result may be *used* on a given run branch is decided by the flow
(see :mod:`flows.curate`): the key says the output is right, the branch must also hold it.
"""

from __future__ import annotations

import dis
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import CodeType
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore

from tasks.stage import StageResult, config_hash
from versioning import DataRepo, NotFound, data_home, open_repo


def results_dir(configured: str | None = None) -> Path:
    """Where stage results are kept: ``configured``, else ``$TOKENLAKE_RESULTS``, else ``<data home>/results``."""
    chosen = configured or os.environ.get("TOKENLAKE_RESULTS")
    return Path(chosen).expanduser().resolve() if chosen else data_home() / "results"


def repository_identity(repo_spec: str) -> str:
    """The same repository named two ways (relative and absolute paths) gives one identity."""
    if repo_spec.startswith("lakefs://"):
        return repo_spec.rstrip("/")
    return "local://" + str(Path(repo_spec.removeprefix("local://")).expanduser().resolve())


def source_fingerprint(config: Any) -> str:
    """Path, size and mtime of every file the ingest config selects."""
    from tasks.ingest.partitions import list_source_files

    digest = hashlib.sha256()
    for source in config.sources:
        digest.update(f"\0source\0{source.name}\0".encode())
        for full, rel in list_source_files(source):
            try:
                st = os.stat(full)
                digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            except OSError:
                digest.update(f"{rel}\0unreadable\n".encode())
    return digest.hexdigest()


def tokenizer_fingerprint(config: Any, repo_spec: str) -> str:
    """The commit ``reuse_tokenizer_from`` resolves to (empty when a tokenizer is trained)."""
    ref = getattr(config, "reuse_tokenizer_from", None)
    if not ref:
        return ""
    try:
        return open_repo(repo_spec, create=False).resolve(ref)
    except NotFound:
        return f"missing:{ref}"  # the stage itself reports the missing ref


def safety_fingerprint(config: Any) -> str:
    """The content of every benchmark and blocklist file (small files, read whole: a list edited
    in place within the same second still changes the key)."""
    digest = hashlib.sha256()
    listed = [*config.decontamination.benchmarks, *config.blocklist.lists]
    for entry in listed:
        digest.update(f"\0{entry.name}\0".encode())
        try:
            digest.update(hashlib.sha256(Path(entry.path).read_bytes()).digest())
        except OSError:
            digest.update(b"unreadable")  # the stage itself reports the missing file
    return digest.hexdigest()


def input_fingerprint(stage: str, config: Any, repo_spec: str) -> str:
    """What a stage reads besides its input commit."""
    if stage == "ingest":
        return source_fingerprint(config)
    if stage == "safety":
        return safety_fingerprint(config)
    if stage == "shard":
        return tokenizer_fingerprint(config, repo_spec)
    return ""


PROJECT_ROOT = Path(__file__).resolve().parents[1]
CODE_PACKAGES = ("tasks", "formats", "expectations")
"""Our packages whose files can change what a stage writes; imports of anything else
(pyarrow, tokenizers, versioning's storage) are the environment, not the stage's code."""


def stage_source_files(stage: str, root: Path = PROJECT_ROOT) -> list[Path]:
    """The files a stage runs: its package ``tasks/<stage>/`` and every module of
    :data:`CODE_PACKAGES` it imports, directly or not (imports inside functions included),
    with the data files of those packages (``expectations/*.json``, the suites its gate runs)."""
    package = root / "tasks" / stage
    if not (package / "__init__.py").is_file():
        raise ValueError(f"no stage package {package}")
    seen: set[Path] = set()
    todo = sorted(package.glob("*.py"))
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += _imported_files(path, root)
    for folder in {p.parent for p in seen if p.parent != root}:
        seen |= {f for f in folder.iterdir() if f.is_file() and f.suffix == ".json"}
    return sorted(seen)


def _imports(code: CodeType) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """(module, level, names imported from it) of every import statement in ``code``, nested
    functions included. Read from the bytecode, not ``ast.parse``: Python 3.11's AST objects
    raise "AST constructor recursion depth mismatch" when two threads build them at once
    (CPython gh-106905), and Prefect parses flow files in the flow-run process too."""
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.opname == "IMPORT_NAME":  # after LOAD_CONST level, LOAD_CONST fromlist
            level, fromlist = instructions[i - 2].argval, instructions[i - 1].argval
            yield instruction.argval, level, tuple(fromlist or ())
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _imports(const)


def _imported_files(path: Path, root: Path) -> list[Path]:
    """The files of our packages that ``path`` imports (each module's package ``__init__`` too)."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for module_name, level, fromlist in _imports(compile(path.read_bytes(), str(path), "exec")):
        if not fromlist:
            names.append(module_name)
            continue
        base = module_name
        if level:
            anchor = package.split(".")[: len(package.split(".")) - level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names += [base] + [f"{base}.{name}" for name in fromlist]
    files = []
    for name in names:
        parts = name.split(".")
        if parts[0] not in CODE_PACKAGES:
            continue
        for depth in range(1, len(parts) + 1):  # a.b.c imports a, a.b and a.b.c
            stem = root.joinpath(*parts[:depth])
            for candidate in (stem / "__init__.py", stem.with_suffix(".py")):
                if candidate.is_file():
                    files.append(candidate)
    return files


def stage_code_version(stage: str) -> str:
    """A hash of the stage's source files under :data:`PROJECT_ROOT` (:func:`stage_source_files`)."""
    return _code_version(stage, PROJECT_ROOT)


@cache
def _code_version(stage: str, root: Path) -> str:
    """Hashed once per process: a long-lived ``tokenlake serve`` keeps running the code it imported."""
    digest = hashlib.sha256()
    for path in stage_source_files(stage, root):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def stage_cache_key(stage: str, repo_spec: str, input_commit: str, config: Any) -> str:
    parts = {
        "stage": stage,
        "repository": repository_identity(repo_spec),
        "input_commit": "" if stage == "ingest" else input_commit,
        "config_hash": config_hash(config),
        "code_version": stage_code_version(stage),
        "inputs": input_fingerprint(stage, config, repo_spec),
    }
    canonical = json.dumps(parts, sort_keys=True).encode()
    return f"tokenlake-{stage}-{hashlib.sha256(canonical).hexdigest()[:40]}"


@dataclass
class StageCachePolicy(CachePolicy):
    """Prefect cache policy of a stage task ``<stage>_task(repo_spec, branch, config, input_commit, ...)``.

    The branch and the flow-run id are deliberately not part of the key: they say where the
    output is written and by whom, not what it is.
    """

    stage: str = ""

    def compute_key(
        self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str:
        return stage_cache_key(self.stage, inputs["repo_spec"], inputs["input_commit"], inputs["config"])


def result_store(directory: Path) -> ResultStore:
    return ResultStore(result_storage=LocalFileSystem(basepath=str(directory)))


def cached_stage_result(directory: Path, key: str) -> StageResult | None:
    """The persisted result under ``key``, or None (absent, expired or unreadable)."""
    store = result_store(directory)
    if not store.exists(key):
        return None
    try:
        value = store.read(key).result
    except Exception:  # an unreadable record is a cache miss, never a failure
        return None
    return value if isinstance(value, StageResult) else None


def seed_stage_result(directory: Path, key: str, result: StageResult) -> None:
    """Record ``result`` under ``key`` (a stage output found on the branch, e.g. of a published version)."""
    result_store(directory).write(key=key, obj=result)


def commit_exists(repo: DataRepo, commit_id: str) -> bool:
    try:
        repo.get_commit(commit_id)
        return True
    except NotFound:
        return False
