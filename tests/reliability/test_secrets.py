"""No credential ever leaves the process that holds it.

lakeFS credentials are planted in the environment and in a lakectl config file, a Prefect API
key in the environment; then ``tokenlake`` curates, trains, curates again and rolls back on
lakeFS (the API double), and fails on purpose twice (a curate with a wrong secret, a call while
lakeFS is down). Every place a
secret could end up is scanned for each credential (and for the HTTP basic-auth form of the
pair): console output and log lines, the Prefect API's flow-run logs and artifacts, every
commit's message and metadata on every branch and tag, every file of the data home (run
directories with checkpoint metadata, metrics, the shard cache, cached stage results, Data
Docs), every byte the lakeFS double stores (lineage records included), and the text of the
exceptions the failed runs printed.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter
from prefect.settings import PREFECT_API_URL

from tests.flows.curate_support import write_corpus
from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.training.helpers import ROOT
from versioning import TransientError
from versioning.lakefs import LakeFSRepo, RetryPolicy

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
REPOSITORY = "secrets"


def curate_toml(path: Path, corpus: dict[str, Path], mix_seed: int) -> Path:
    path.write_text(
        "\n".join(
            [
                *[
                    f'[[ingest.sources]]\nname = "{n}"\nkind = "{"code" if n == "code" else "prose"}"\n'
                    f'format = "files"\npath = "{p}"\n'
                    for n, p in corpus.items()
                ],
                "[shards]\nvocab_size = 300\nseq_len = 32\ntokenizer_sample_mb = 1.0\n",
                "[gates]\nmin_documents = 10\nmin_tokens = 1000\n",
                f"[mix]\nseed = {mix_seed}\n",
                "[retry]\nretries = 1\nbackoff_seconds = 0.05\n",
            ]
        )  # fmt: skip
    )
    return path


class Tokenlake:
    """``tokenlake --repo lakefs://secrets ...`` in a subprocess; every line it printed is kept."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.output: list[str] = []

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [sys.executable, "-m", "flows.cli", "--repo", f"lakefs://{REPOSITORY}", *args],
            cwd=ROOT, env=env or self.env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        self.output += [out.stdout, out.stderr]
        return out


def every(page) -> list:
    """All items of a paged Prefect API read (the server answers at most 200 at a time)."""
    items: list = []
    while batch := page(len(items)):
        items += batch
    return items


def hits(text: str | bytes, needles: dict[str, str]) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [name for name, needle in needles.items() if needle.encode() in data]


def test_no_credential_appears_in_logs_artifacts_metadata_files_or_errors(tmp_path):
    home, corpus = tmp_path / "home", write_corpus(tmp_path / "sources", documents=30)
    prefect_key = "pnu_" + secrets.token_urlsafe(27)
    with LakeFSDouble(tmp_path / "lakefs") as double:
        key_id, secret = double.access_key_id, double.secret_access_key
        wrong_secret = secrets.token_urlsafe(30)
        needles = {
            "access key id": key_id, "secret access key": secret, "Prefect API key": prefect_key,
            "wrong secret": wrong_secret,
            "basic auth": base64.b64encode(f"{key_id}:{secret}".encode()).decode(),
        }  # fmt: skip
        lakectl = tmp_path / "lakectl.yaml"
        lakectl.write_text(yaml.safe_dump({
            "server": {"endpoint_url": double.endpoint},
            "credentials": {"access_key_id": key_id, "secret_access_key": secret},
        }))  # fmt: skip
        env = {
            **os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_API_KEY": prefect_key,
            "PREFECT_LOGGING_LEVEL": "INFO", "TOKENLAKE_HOME": str(home), "LAKECTL_CONFIG_FILE": str(lakectl),
            "LAKECTL_SERVER_ENDPOINT_URL": double.endpoint, "LAKECTL_CREDENTIALS_ACCESS_KEY_ID": key_id,
            "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": secret,
        }  # fmt: skip
        tokenlake = Tokenlake(env)
        from_file_only = {k: v for k, v in env.items() if not k.startswith("LAKECTL_CREDENTIALS")}

        first = tokenlake(
            "curate",
            "--config",
            str(curate_toml(tmp_path / "v1.toml", corpus, 0)),
            "--json",
            env=from_file_only,
        )
        assert first.returncode == 0, first.stderr[-3000:]
        v1 = json.loads(first.stdout)["tag"]
        trained = tokenlake("train", "--dataset", v1, "--steps", "4", "--run", "secret-run",
                            "--set", "checkpoint.every=2", "--set", "eval_every=0")  # fmt: skip
        assert trained.returncode == 0, trained.stderr[-3000:]
        second = tokenlake("curate", "--config", str(curate_toml(tmp_path / "v2.toml", corpus, 1)))
        assert second.returncode == 0, second.stderr[-3000:]
        rolled = tokenlake("rollback", "--to", v1)
        assert rolled.returncode == 0, rolled.stderr[-3000:]

        refused = tokenlake("curate", "--config", str(tmp_path / "v1.toml"),
                            env={**env, "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY": wrong_secret})  # fmt: skip
        assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout
        double.faults = FaultConfig(error_rate=1.0)  # lakeFS down: the adapter's own error text
        with pytest.raises(TransientError) as down:
            LakeFSRepo.connect(
                double.endpoint, key_id, secret, REPOSITORY, retry=RetryPolicy(attempts=2)
            ).resolve(v1)
        tokenlake.output.append(str(down.value))
        double.faults = FaultConfig()

        found: dict[str, list[str]] = {}
        for i, text in enumerate(tokenlake.output):
            found[f"console output {i}"] = hits(text, needles)

        with get_client(sync_client=True) as client:
            logs = every(lambda offset: client.read_logs(log_filter=LogFilter(), limit=200, offset=offset))
            artifacts = every(lambda offset: client.read_artifacts(limit=200, offset=offset))
            runs = every(lambda offset: client.read_flow_runs(limit=200, offset=offset))
        assert logs and artifacts and runs
        found["Prefect logs"] = hits("\n".join(log.message for log in logs), needles)
        found["Prefect artifacts"] = hits(
            "\n".join(f"{a.key} {a.description} {a.data}" for a in artifacts), needles
        )
        found["Prefect flow-run parameters and states"] = hits(
            "\n".join(f"{r.parameters} {r.state.message if r.state else ''}" for r in runs), needles
        )

        repo = LakeFSRepo.connect(double.endpoint, key_id, secret, REPOSITORY, retry=RetryPolicy(attempts=3))
        refs = [*repo.list_branches(), *repo.list_tags()]
        commits = {c.id: c for ref in refs for c in repo.log(ref)}
        assert len(commits) > 10 and "runs" in refs
        found["commit messages and metadata"] = hits(
            "\n".join(f"{c.message} {c.metadata}" for c in commits.values()), needles
        )
        lineage = [s.path for s in repo.list("runs", "runs/secret-run/")]
        assert lineage, "the training run wrote lineage records"
        found["lineage records"] = hits(b"".join(repo.get("runs", p) for p in lineage), needles)

    checkpoint_meta = list(home.glob("runs/secret-run/checkpoints/step-*/meta.json"))
    assert checkpoint_meta
    for root in (home, tmp_path / "lakefs"):
        files = [p for p in root.rglob("*") if p.is_file()]
        assert files
        found[f"files under {root.name}/"] = sorted(
            {f"{name} in {p.relative_to(root)}" for p in files for name in hits(p.read_bytes(), needles)}
        )
    assert {where: names for where, names in found.items() if names} == {}
