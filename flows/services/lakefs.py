"""A lakeFS server on 127.0.0.1, built from its Go module (``deploy/services.toml``).

Its configuration file is written into the work directory, readable by its owner only: the KV
store (lakeFS's embedded ``local`` store, or PostgreSQL), the blockstore (``local``, or an S3
store such as MinIO) and a generated encryption secret. Once it answers, it is set up the way
the web UI does it (``POST /api/v1/setup_lakefs``) with a generated admin key pair, so the keys
never appear on a command line, in a log or in a process listing.
"""

from __future__ import annotations

import json
import secrets
import string
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flows.services.build import binary
from flows.services.minio import S3Endpoint
from flows.services.process import ServiceFailed, ServiceProcess, free_port

_KEY_ALPHABET = string.ascii_uppercase + string.digits


class Environment(dict):
    """Environment variables that carry credentials: their values never appear in a repr (a
    failing test prints its fixtures' values)."""

    def __repr__(self) -> str:
        return "Environment(" + ", ".join(f"{name}=***" for name in self) + ")"


@dataclass(frozen=True)
class LakeFSCredentials:
    endpoint: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)

    def lakectl_environment(self) -> Environment:
        """The variables tokenlake (and lakectl) read to reach this server."""
        return Environment(
            LAKECTL_SERVER_ENDPOINT_URL=self.endpoint,
            LAKECTL_CREDENTIALS_ACCESS_KEY_ID=self.access_key_id,
            LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY=self.secret_access_key,
        )


def generated_credentials(endpoint: str) -> LakeFSCredentials:
    """An AWS-shaped key pair, as lakeFS issues them (``AKIAJ`` + 15, and 40 characters)."""
    key_id = "AKIAJ" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(15))
    return LakeFSCredentials(endpoint, key_id, secrets.token_urlsafe(30))


class LakeFSServer:
    """``lakefs run`` with a generated configuration; ``credentials`` are the admin's."""

    def __init__(
        self,
        workdir: Path,
        *,
        s3: S3Endpoint | None = None,
        postgres_url: str | None = None,
        port: int | None = None,
        settings: dict | None = None,
        keys: tuple[str, str, str] | None = None,
    ):
        """``s3``: the blockstore (else lakeFS's local one under ``workdir``); ``postgres_url``:
        the KV store (else lakeFS's embedded one); ``settings``: merged into the configuration;
        ``keys``: the admin key id, its secret and the encryption secret of an earlier start on
        the same KV store (else generated)."""
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.s3 = s3
        self.postgres_url = postgres_url
        self.settings = settings or {}
        endpoint = f"http://127.0.0.1:{self.port}"
        if keys is None:
            self.credentials = generated_credentials(endpoint)
            self._encrypt_secret = secrets.token_hex(32)
        else:
            self.credentials = LakeFSCredentials(endpoint, keys[0], keys[1])
            self._encrypt_secret = keys[2]
        self.config_path = self.workdir / "lakefs.yaml"
        self.process = ServiceProcess(
            "lakefs",
            [str(binary("lakefs")), "run", "--config", str(self.config_path)],
            self.workdir,
            ready=self._healthy,
        )

    @property
    def keys(self) -> tuple[str, str, str]:
        """What a later start on the same KV store needs (``keys=``); secrets: never print them."""
        return (self.credentials.access_key_id, self.credentials.secret_access_key, self._encrypt_secret)

    @property
    def endpoint(self) -> str:
        return self.credentials.endpoint

    def storage_namespace(self, prefix: str = "tokenlake") -> str:
        """Where repositories of this server may keep their objects."""
        if self.s3 is not None:
            return f"s3://{self.s3_bucket}/{prefix}"
        return f"local://{prefix}"

    @property
    def s3_bucket(self) -> str:
        return self.settings.get("bucket", "tokenlake")

    def configuration(self) -> dict:
        if self.postgres_url:
            database = {"type": "postgres", "postgres": {"connection_string": self.postgres_url}}
        else:
            database = {"type": "local", "local": {"path": str(self.workdir / "kv")}}
        if self.s3 is not None:
            blockstore = {
                "type": "s3",
                "s3": {
                    "endpoint": self.s3.url,
                    "force_path_style": True,
                    "discover_bucket_region": False,
                    "region": self.s3.region,
                    "credentials": {
                        "access_key_id": self.s3.access_key_id,
                        "secret_access_key": self.s3.secret_access_key,
                    },
                },
            }
        else:
            blockstore = {"type": "local", "local": {"path": str(self.workdir / "blocks")}}
        config = {
            "listen_address": f"127.0.0.1:{self.port}",
            "logging": {"level": "WARN", "format": "text"},
            "database": database,
            "blockstore": blockstore,
            "auth": {"encrypt": {"secret_key": self._encrypt_secret}},
            "stats": {"enabled": False},
            "usage_report": {"enabled": False},
            "email_subscription": {"enabled": False},
        }
        for key, value in self.settings.items():
            if key != "bucket":
                config[key] = value
        return config

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint}/api/v1/healthcheck", timeout=2) as answer:
            return answer.status == 204

    def _setup_state(self) -> str:
        with urllib.request.urlopen(f"{self.endpoint}/api/v1/setup_lakefs", timeout=10) as answer:
            return json.load(answer).get("state", "")

    def _set_up(self) -> None:
        if self._setup_state() == "initialized":
            return
        body = json.dumps(
            {
                "username": "tokenlake-admin",
                "key": {
                    "access_key_id": self.credentials.access_key_id,
                    "secret_access_key": self.credentials.secret_access_key,
                },
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/api/v1/setup_lakefs",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()  # the body repeats the keys: read and dropped
        except urllib.error.HTTPError as refused:
            raise ServiceFailed(
                f"lakeFS at {self.endpoint} refused its setup (HTTP {refused.code})"
            ) from None

    def start(self) -> LakeFSServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.touch(mode=0o600, exist_ok=True)
        self.config_path.chmod(0o600)
        self.config_path.write_text(yaml.safe_dump(self.configuration(), sort_keys=False))
        self.process.start()
        self._set_up()
        return self

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def restart(self) -> None:
        """Start again on the same port, KV store and blockstore: set up already, same keys."""
        self.process.restart()

    def __enter__(self) -> LakeFSServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
