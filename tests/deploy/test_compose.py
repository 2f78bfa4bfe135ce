"""deploy/compose.yaml checked without Docker (none runs here): it parses, interpolates from
.env.example, names the services deploy/README.md documents, pins every image, publishes the
ports tokenlake's settings point at, sets only variables tokenlake reads, and writes no credential
outside .env.example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from flows.services.stack import VARIABLE, interpolate  # the one reading of compose's ${...}

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SOURCE_PACKAGES = ("flows", "tasks", "training", "versioning", "formats")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|CONNECTION_STRING|CONNECTION_URL|ROOT_USER")


def env_example() -> dict[str, str]:
    pairs = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


def resolved(node, env):
    if isinstance(node, dict):
        return {k: resolved(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolved(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(raw) -> dict:
    return resolved(raw, env_example())["services"]


def environment(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def published(service: dict) -> set[int]:
    return {int(str(p).split(":")[0]) for p in service.get("ports", [])}


def source_text() -> str:
    return "\n".join(p.read_text() for pkg in SOURCE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_services_the_readme_names_are_the_services_of_the_stack(services):
    readme = (DEPLOY / "README.md").read_text()
    named = set(re.findall(r"^\| `([a-z-]+)` \| `", readme, re.MULTILINE))
    assert named == set(services)
    assert {"lakefs", "lakefs-db", "minio", "prefect-server", "prefect-db", "prefect-worker"} <= named


def test_every_image_is_pinned_by_version(services):
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and re.search(r"\d", tag) and tag != "latest", f"{name}: {image} is not pinned"


def test_lakefs_and_prefect_are_reached_where_they_listen(services):
    lakefs, prefect = services["lakefs"], services["prefect-server"]
    assert 8000 in published(lakefs) and 4200 in published(prefect)
    assert "--port 4200" in prefect["command"]
    for name in ("prefect-worker", "prefect-deploy"):
        env = environment(services[name])
        assert env["LAKECTL_SERVER_ENDPOINT_URL"] == "http://lakefs:8000"
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["TOKENLAKE_REPO"] == f"lakefs://{env_example()['LAKEFS_REPOSITORY']}"
    lakectl = yaml.safe_load((DEPLOY / "lakectl.yaml").read_text())
    assert lakectl == {"server": {"endpoint_url": "http://127.0.0.1:8000"}}  # the endpoint, no keys
    readme = (DEPLOY / "README.md").read_text()
    assert "TOKENLAKE_LAKEFS_ENDPOINT=http://127.0.0.1:8000" in readme
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in readme


def test_lakefs_keys_of_the_server_are_the_keys_of_its_clients(services):
    server, worker = environment(services["lakefs"]), environment(services["prefect-worker"])
    assert server["LAKEFS_INSTALLATION_ACCESS_KEY_ID"] == worker["LAKECTL_CREDENTIALS_ACCESS_KEY_ID"]
    assert server["LAKEFS_INSTALLATION_SECRET_ACCESS_KEY"] == worker["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"]
    assert (
        server["LAKEFS_BLOCKSTORE_S3_CREDENTIALS_SECRET_ACCESS_KEY"]
        == environment(services["minio"])["MINIO_ROOT_PASSWORD"]
    )
    assert environment(services["prefect-worker"])["TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"].startswith("s3://")


def test_tokenlake_reads_every_variable_the_stack_sets_for_it(services):
    code = source_text()
    pull_steps = (DEPLOY / "prefect.yaml").read_text()  # `{{ $TOKENLAKE_ROOT }}`
    for name in ("prefect-worker", "prefect-deploy"):
        for variable in environment(services[name]):
            if variable.startswith(("TOKENLAKE_", "LAKECTL_")):
                read = f'"{variable}"' in code or f"${variable}" in pull_steps
                assert read, f"{name} sets {variable}, which tokenlake never reads"
    tests = (ROOT / "tests/lakefs_real/__init__.py").read_text()  # the real-lakeFS harness
    readme = (DEPLOY / "README.md").read_text()
    for variable in set(re.findall(r"export (TOKENLAKE_\w+)=", readme)):
        assert f'"{variable}"' in code + tests, f"deploy/README.md sets {variable}, which nothing reads"


def test_no_credential_is_written_outside_env_example(raw):
    secrets = {v for k, v in env_example().items() if SECRET_NAME.search(k)}
    assert secrets, ".env.example holds the credentials"

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if SECRET_NAME.search(str(key)) and isinstance(value, str):
                    literal = VARIABLE.sub("", value)
                    assert VARIABLE.search(value), (
                        f"{where}.{key} is written in the file, not taken from .env"
                    )
                    assert not re.search(r"://[^/@]*:[^/@]+@", literal), f"{where}.{key} holds a password"
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(raw, "compose")
    for path in (
        DEPLOY / "compose.yaml",
        DEPLOY / "lakectl.yaml",
        DEPLOY / "README.md",
        DEPLOY / "Dockerfile",
    ):
        text = path.read_text()
        assert not [s for s in secrets if s in text], f"{path.name} repeats a credential of .env.example"
    assert "deploy/.env" in (ROOT / ".gitignore").read_text().split()


def test_every_variable_the_stack_uses_is_in_env_example():
    used = {m.group(1) for m in VARIABLE.finditer((DEPLOY / "compose.yaml").read_text())}
    assert used <= set(env_example()), f"not in .env.example: {sorted(used - set(env_example()))}"


def test_the_old_compose_file_is_gone_and_nothing_points_at_it():
    assert not (DEPLOY / "docker-compose.yml").exists()
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), DEPLOY / "Dockerfile"]:
        assert "docker-compose.yml" not in path.read_text(), f"{path} names deploy/docker-compose.yml"
