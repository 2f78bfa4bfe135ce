"""Shared by the curate chaos campaigns: small demo sources, a Prefect server, dataset checks."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from common import ROOT, kill_tree

from flows.demo_sources import MB, DemoBudget, demo_sources
from flows.wap import MAIN, PublishRecord
from versioning import DataRepo, NotFound

STAGE_OUTPUTS = ("raw/", "filtered/", "dedup/")
VOLATILE = ("reports/",)
SETUP_PREFIXES = (
    "_lakefs_actions/",
    "_tokenlake/",
)  # the publish guard, installed on main before any publish  # stage reports hold timings, flow-run ids and Data Docs pages


def write_demo_config(work: Path, code_mb: float, prose_mb: float) -> Path:
    """Small demo sources (the stdlib as code, package metadata and licenses as prose) and a
    curate TOML over them with a small vocabulary."""
    budget = DemoBudget(
        code_bytes=int(code_mb * MB),
        prose_bytes=int(prose_mb * MB * 2 / 3),
        license_bytes=int(prose_mb * MB / 3),
    )
    sources = demo_sources(work / "sources", budget)
    lines = []
    for source in sources:
        lines += [
            "[[ingest.sources]]",
            f'name = "{source.name}"',
            f'kind = "{source.kind}"',
            'format = "files"',
            f'path = "{source.path}"',
            "",
        ]
    lines += [
        "[shards]", "vocab_size = 512", "seq_len = 128", "tokenizer_sample_mb = 1.0", "",
        "[gates]", "min_documents = 10", "min_tokens = 1000", "max_quarantined_fraction = 0.9", "",
        "[retry]", "retries = 3", "backoff_seconds = 0.2", "jitter_factor = 0.5", "",
    ]  # fmt: skip
    path = work / "curate.toml"
    path.write_text("\n".join(lines))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(prefect_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }


@contextmanager
def prefect_server(home: Path) -> Iterator[dict[str, str]]:
    """A Prefect API server for the campaign (a killed curate process must not take it along);
    yields the environment that points a process at it."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = base_env(home)
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the Prefect server did not start; see {home / 'server.log'}")
            time.sleep(0.5)
        yield {**env, "PREFECT_API_URL": url}
    finally:
        kill_tree(server.pid)
        server.wait()
        log.close()


def tokenlake(
    args: list[str], env: dict[str, str], log: Path, timeout: float = 1800
) -> subprocess.CompletedProcess:
    with log.open("ab") as f:
        f.write(f"\n$ tokenlake {' '.join(args)}\n".encode())
        f.flush()
        stdout = subprocess.run(
            [sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=f,
            timeout=timeout,
        )  # fmt: skip
        f.write(stdout.stdout)
    return stdout


def content(repo: DataRepo, ref: str) -> dict[str, str]:
    """path -> sha256 of every object at ``ref`` outside the volatile prefixes.

    Provenance names commits: the manifest's ``input_commit``, the MinHash index's run folder
    and its ``run.json``. Commit ids differ between two repositories by construction (they hash
    timestamps and flow-run ids), so each id of ``ref``'s own history is replaced, in paths and
    in JSON objects, by the stage that made it before hashing: two datasets compare equal when
    every byte is equal and every commit they cite is the same stage's."""
    stages = [(c.id, f"<{c.metadata.get('stage') or 'initial'} commit>") for c in repo.log(ref)]

    def normalize(text: str) -> str:
        for commit_id, name in stages:
            text = text.replace(commit_id, name).replace(commit_id[:16], name)
        return text

    found = {}
    for stat in repo.list(ref):
        if stat.path.startswith(VOLATILE):
            continue
        data = repo.get(ref, stat.path)
        if stat.path.endswith(".json"):
            data = normalize(data.decode()).encode()
        found[normalize(stat.path)] = hashlib.sha256(data).hexdigest()
    return found


def differences(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    changed = sorted(p for p in expected.keys() & actual.keys() if expected[p] != actual[p])
    out = []
    for what, paths in (("missing", missing), ("extra", extra), ("different bytes", changed)):
        if paths:
            out.append(f"{len(paths)} {what} (e.g. {paths[0]})")
    return out


def ids(repo: DataRepo, ref: str, prefix: str) -> list[str]:
    values: list[str] = []
    for stat in repo.list(ref, prefix):
        if stat.path.endswith(".parquet"):
            table = pq.read_table(pa.BufferReader(repo.get(ref, stat.path)), columns=["id"])
            values += table.column("id").to_pylist()
    return values


def duplicated_documents(repo: DataRepo, ref: str) -> list[str]:
    """Stage outputs that hold a document twice (by id); ingest's kept + quarantined count once."""
    problems = []
    for prefix in (*STAGE_OUTPUTS, "quarantine/validate/", "quarantine/dedup/"):
        found = ids(repo, ref, prefix)
        if len(found) != len(set(found)):
            problems.append(f"{prefix} holds {len(found) - len(set(found))} document(s) twice")
    ingested = ids(repo, ref, "raw/") + ids(repo, ref, "quarantine/ingest/")
    if len(ingested) != len(set(ingested)):
        problems.append(
            f"raw/ + quarantine/ingest/ hold {len(ingested) - len(set(ingested))} document(s) twice"
        )
    return problems


def fully_published(repo: DataRepo, commit_id: str) -> str:
    """'' when ``commit_id`` is a complete published version, or holds no dataset at all (the
    initial commit, the publish guard's installation); else why not."""
    commit = repo.get_commit(commit_id)
    if PublishRecord.from_commit(commit) is None:
        data = [s.path for s in repo.list(commit_id) if not s.path.startswith(SETUP_PREFIXES)]
        if data:
            return (
                f"main at {commit_id[:12]}, a commit of stage {commit.metadata.get('stage')!r}, holds dataset "
                f"objects ({data[0]}, ...) but is not a publish"
            )
        return ""
    try:
        manifest = json.loads(repo.get(commit_id, "shards/manifest.json"))
        repo.get(commit_id, "mix.json")
    except NotFound as exc:
        return f"main at publish {commit_id[:12]} lacks {exc}"
    for shard in manifest["shards"]:
        data = repo.get(commit_id, shard["name"])
        if hashlib.sha256(data).hexdigest() != shard["sha256"]:
            return f"main at publish {commit_id[:12]}: {shard['name']} does not match the manifest"
    return ""


def publishes_on_main(repo: DataRepo) -> int:
    return sum(PublishRecord.from_commit(c) is not None for c in repo.log(MAIN))


def janitor_verdicts(out: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    try:
        return json.loads(out.stdout)["branches"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return []
