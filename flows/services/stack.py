"""The stack of ``deploy/compose.yaml`` started natively, without Docker, from the compose file itself.

    ./dev stack up [--dir DIR]      start it; prints where everything answers and what to export
    ./dev stack status [--dir DIR]  which services answer
    ./dev stack down [--dir DIR]    stop it (the data stays in DIR)

The compose file is the one source of truth: each service's environment and command are read
from it, with ``${VARIABLE}`` filled from generated credentials (one per variable of
``deploy/.env.example``, kept in ``DIR/stack.env``, mode 0600) and every service name rewritten
to a 127.0.0.1 port. So PostgreSQL (Debian's package; one cluster with the ``lakefs`` and
``prefect`` databases), MinIO and its bucket, lakeFS (PostgreSQL KV, MinIO blockstore, its first
admin from ``LAKEFS_INSTALLATION_*``), ``prefect server start`` on PostgreSQL, ``prefect deploy``
of ``deploy/prefect.yaml`` and a process worker run with what the compose file gives them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from flows.services.build import build, load_pins
from flows.services.lakefs import Environment, LakeFSServer
from flows.services.minio import MinIOServer
from flows.services.postgres import PostgresServer
from flows.services.process import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
ENV_EXAMPLE = ROOT / "deploy" / ".env.example"
DEFAULT_DIR = Path.home() / ".local/share/tokenlake/stack"
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
_SECRET = re.compile(r"PASSWORD|SECRET|ACCESS_KEY_ID")


def compose_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def generated_variables() -> dict[str, str]:
    """Every variable of ``deploy/.env.example``: secrets generated, the rest as given there."""
    found: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        name, _, value = line.partition("=")
        if not line.strip() or line.startswith("#") or not value:
            continue
        if name == "LAKEFS_ACCESS_KEY_ID":
            value = "AKIAJ" + "".join(
                secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(15)
            )
        elif _SECRET.search(name) or name == "MINIO_ROOT_USER":
            value = secrets.token_hex(20)
        found[name] = value
    return found


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's interpolation: ${NAME}, ${NAME:-default}, ${NAME:?error}; $$ is a literal $."""

    def value(match: re.Match) -> str:
        name, kind, default = match.groups()
        if name in variables:
            return variables[name]
        if kind == "-":
            return default
        raise KeyError(f"deploy/compose.yaml needs {name}, which deploy/.env.example does not set")

    return VARIABLE.sub(value, text.replace("$$", "\0")).replace("\0", "$")


@dataclass(frozen=True)
class Ports:
    postgres: int
    minio: int
    lakefs: int
    prefect: int

    def hosts(self) -> dict[str, str]:
        """Compose's service addresses -> the native ones."""
        return {
            "lakefs-db:5432": f"127.0.0.1:{self.postgres}",
            "prefect-db:5432": f"127.0.0.1:{self.postgres}",
            "minio:9000": f"127.0.0.1:{self.minio}",
            "lakefs:8000": f"127.0.0.1:{self.lakefs}",
            "prefect-server:4200": f"127.0.0.1:{self.prefect}",
        }


class Stack:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        state = self.workdir / "stack.env"
        if state.exists():
            saved = json.loads(state.read_text())
        else:
            saved = {"variables": generated_variables(), "ports": [free_port() for _ in range(4)]}
            state.touch(mode=0o600)
            state.write_text(json.dumps(saved))
        self.variables: dict[str, str] = saved["variables"]
        self.ports = Ports(*saved["ports"])
        self.services = compose_services()

    def environment(self, service: str) -> dict[str, str]:
        """The compose service's environment, interpolated, with its addresses made native."""
        raw = self.services[service].get("environment", {})
        env = {}
        for name, value in raw.items():
            text = interpolate(str(value), self.variables)
            for compose_host, native in self.ports.hosts().items():
                text = text.replace(compose_host, native)
            env[name] = text
        return env

    def command(self, service: str) -> list[str]:
        command = self.services[service]["command"]
        return shlex.split(command) if isinstance(command, str) else list(command)

    # the services, in the compose file's dependency order

    def _postgres(self) -> PostgresServer:
        lakefs_db, prefect_db = self.environment("lakefs-db"), self.environment("prefect-db")
        return PostgresServer(
            self.workdir / "postgres",
            port=self.ports.postgres,
            databases={
                lakefs_db["POSTGRES_DB"]: lakefs_db["POSTGRES_PASSWORD"],
                prefect_db["POSTGRES_DB"]: prefect_db["POSTGRES_PASSWORD"],
            },
        )

    def _minio(self) -> MinIOServer:
        env = self.environment("minio")
        bucket = self.environment("minio-bucket")["MINIO_BUCKET"]
        return MinIOServer(
            self.workdir / "minio",
            bucket=bucket,
            port=self.ports.minio,
            keys=(env["MINIO_ROOT_USER"], env["MINIO_ROOT_PASSWORD"]),
        )

    def _lakefs(self, minio: MinIOServer) -> LakeFSServer:
        env = self.environment("lakefs")
        server = LakeFSServer(
            self.workdir / "lakefs",
            s3=minio.endpoint,
            postgres_url=env["LAKEFS_DATABASE_POSTGRES_CONNECTION_STRING"],
            port=self.ports.lakefs,
            settings={"bucket": minio.bucket},
            keys=(
                env["LAKEFS_INSTALLATION_ACCESS_KEY_ID"],
                env["LAKEFS_INSTALLATION_SECRET_ACCESS_KEY"],
                env["LAKEFS_AUTH_ENCRYPT_SECRET_KEY"],
            ),
        )
        server.process.env = env | {"LAKEFS_LISTEN_ADDRESS": f"127.0.0.1:{self.ports.lakefs}"}
        return server

    def tokenlake_environment(self) -> Environment:
        """What the worker gets in the compose file, made native: for a user's shell too."""
        env = self.environment("prefect-worker")
        env["TOKENLAKE_ROOT"] = str(ROOT)
        env["TOKENLAKE_HOME"] = str(self.workdir / "tokenlake")
        env["PREFECT_HOME"] = str(self.workdir / "prefect-client")
        return Environment(env)

    def _prefect_server(self) -> ServiceProcess:
        env = self.environment("prefect-server") | {"PREFECT_HOME": str(self.workdir / "prefect-server")}
        argv = self.command("prefect-server")
        argv[argv.index("--host") + 1] = "127.0.0.1"
        argv[argv.index("--port") + 1] = str(self.ports.prefect)
        return ServiceProcess(
            "prefect-server",
            argv,
            self.workdir / "prefect-server",
            ready=lambda: _answers(f"http://127.0.0.1:{self.ports.prefect}/api/health"),
            env=env | _venv_path(),
            startup_timeout_s=300,
        )

    def _prefect_worker(self) -> ServiceProcess:
        return ServiceProcess(
            "prefect-worker",
            self.command("prefect-worker"),
            self.workdir / "prefect-worker",
            ready=lambda: True,
            env=dict(self.tokenlake_environment()) | _venv_path(),
        )

    def deploy(self) -> None:
        """``prefect deploy`` of the compose file's one-shot service, run from the project root."""
        done = subprocess.run(
            self.command("prefect-deploy"),
            cwd=ROOT,
            env=os.environ | dict(self.tokenlake_environment()) | _venv_path(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"prefect deploy failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    def up(self) -> Running:
        pins = load_pins()
        for name in ("minio", "lakefs"):
            build(pins[name], say=lambda line: None)
        running = Running(self)
        try:
            running.start()
        except BaseException:
            running.stop()
            raise
        return running


class Running:
    """The started services, stopped in reverse order."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.postgres = stack._postgres()
        self.minio = stack._minio()
        self.lakefs = stack._lakefs(self.minio)
        self.prefect_server = stack._prefect_server()
        self.worker = stack._prefect_worker()
        self._started: list = []

    def start(self) -> None:
        for service in (self.postgres, self.minio, self.lakefs):
            service.start()
            self._started.append(service)
        self.prefect_server.start()
        self._started.append(self.prefect_server)
        self.stack.deploy()
        self.worker.start()
        self._started.append(self.worker)

    def stop(self) -> None:
        while self._started:
            self._started.pop().stop()

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.stack.ports.prefect}/api"


def _venv_path() -> dict[str, str]:
    """PATH with this interpreter's scripts first: the compose commands name ``prefect`` bare."""
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status == 200


def status(stack: Stack) -> dict[str, bool]:
    ports = stack.ports
    checks = {
        "lakefs": f"http://127.0.0.1:{ports.lakefs}/_health",
        "minio": f"http://127.0.0.1:{ports.minio}/minio/health/live",
        "prefect-server": f"http://127.0.0.1:{ports.prefect}/api/health",
    }
    found = {}
    for name, url in checks.items():
        try:
            found[name] = _answers(url)
        except OSError:
            found[name] = False
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev stack", description="deploy/compose.yaml's stack, natively.")
    parser.add_argument("action", choices=["up", "status", "down"])
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"data and credentials (default {DEFAULT_DIR})"
    )
    args = parser.parse_args(argv)
    stack = Stack(args.dir.expanduser().resolve())
    if args.action == "status":
        for name, up in status(stack).items():
            print(f"{name}: {'up' if up else 'down'}")
        return 0
    if args.action == "down":
        pid_file = stack.workdir / "stack.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            print("stopping the stack")
        return 0
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    running = stack.up()
    (stack.workdir / "stack.pid").write_text(str(os.getpid()))
    env_file = stack.workdir / "tokenlake.env"
    env_file.touch(mode=0o600)
    env_file.write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in stack.tokenlake_environment().items())
    )
    print(
        f"PostgreSQL 127.0.0.1:{stack.ports.postgres}, MinIO {running.minio.endpoint.url}, lakeFS {running.lakefs.endpoint}"
    )
    print(f"Prefect UI and API: http://127.0.0.1:{stack.ports.prefect} (worker on pool tokenlake)")
    print(f"in another shell: . {env_file}   (credentials inside, mode 0600)")
    print("Ctrl-C or ./dev stack down stops it.", flush=True)
    try:
        stopping.wait()
    finally:
        running.stop()
        (stack.workdir / "stack.pid").unlink(missing_ok=True)
    print("stopped")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DO_NOT_TRACK", "1")
    raise SystemExit(main())
