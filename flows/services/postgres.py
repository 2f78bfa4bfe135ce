"""A PostgreSQL server on 127.0.0.1 from Debian's packages (``apt-get install postgresql``).

One cluster in the work directory holds a database per client (lakeFS's KV store, the Prefect
server's database), each owned by its own role with its own password; the superuser's password
is generated and kept in a file only its owner reads. Passwords travel in ``PGPASSWORD``, never
on a command line. PostgreSQL refuses to run as root, so as root the cluster belongs to the
``postgres`` user the package creates and lives in that user's home
(``/var/lib/postgresql/tokenlake-<hash of the work directory>``), which it can reach.
"""

from __future__ import annotations

import glob
import hashlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from flows.services.build import ServiceUnavailable
from flows.services.process import ServiceProcess, free_port

SUPERUSER = "tokenlake_admin"


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        raise ServiceUnavailable("PostgreSQL is not installed: apt-get install postgresql (Debian's package)")
    return Path(found[-1]).parent


class PostgresServer:
    def __init__(self, workdir: Path, *, databases: dict[str, str], port: int | None = None):
        """``databases``: name -> password of the role of the same name that owns it."""
        self.workdir = Path(workdir)
        self.databases = databases
        self.port = port or free_port()
        self.bin = postgres_bin()
        self._as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_owner:
            digest = hashlib.sha256(str(self.workdir.resolve()).encode()).hexdigest()[:16]
            self.home = Path("/var/lib/postgresql") / f"tokenlake-{digest}"
        else:
            self.home = self.workdir
        self.data = self.home / "data"
        self.process = ServiceProcess(
            "postgres",
            [
                *self._as_owner,
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.home}",
            ],
            self.workdir,
            ready=self._ready,
        )

    def url(self, database: str, scheme: str = "postgres") -> str:
        """The connection URL of ``database`` as its owner (it holds the password: never log it)."""
        password = self.databases[database]
        suffix = "?sslmode=disable" if scheme == "postgres" else ""
        return f"{scheme}://{database}:{password}@127.0.0.1:{self.port}/{database}{suffix}"

    def _superuser_password(self) -> str:
        path = self.home / "superuser.password"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.touch(mode=0o600)
            path.write_text(secrets.token_urlsafe(24))
        if self._as_owner:
            shutil.chown(path, "postgres")
        return path.read_text().strip()

    def _initdb(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        password_file = self.home / "superuser.password"
        self._superuser_password()
        if self._as_owner:
            shutil.chown(self.home, "postgres")
        done = subprocess.run(
            [
                *self._as_owner,
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                f"--pwfile={password_file}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ServiceUnavailable(f"PostgreSQL's initdb failed for {self.data}: {done.stderr.strip()}")

    def _ready(self) -> bool:
        done = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"], capture_output=True
        )
        return done.returncode == 0

    def _sql(self, statement: str, database: str = "postgres") -> str:
        done = subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
             "-d", database, "-v", "ON_ERROR_STOP=1", "-tAc", statement],
            env=os.environ | {"PGPASSWORD": self._superuser_password()},
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise ServiceUnavailable(f"PostgreSQL refused a setup statement: {done.stderr.strip()}")
        return done.stdout.strip()

    def _create_databases(self) -> None:
        for name, password in self.databases.items():
            quoted = password.replace("'", "''")
            if self._sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{name}'") != "1":
                self._sql(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{quoted}'")
            else:
                self._sql(f"ALTER ROLE \"{name}\" PASSWORD '{quoted}'")
            if self._sql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") != "1":
                self._sql(f'CREATE DATABASE "{name}" OWNER "{name}"')

    def start(self) -> PostgresServer:
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        self.process.start()
        self._create_databases()
        return self

    def stop(self) -> None:
        self.process.stop()

    def remove(self) -> None:
        """Stop and delete the cluster (its home may lie outside the work directory)."""
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def kill(self) -> None:
        self.process.kill()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
