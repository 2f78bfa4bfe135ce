"""A MinIO server on 127.0.0.1: the S3 store behind lakeFS, with generated root credentials."""

from __future__ import annotations

import secrets
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from flows.services.build import binary
from flows.services.process import ServiceProcess, free_port


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 store answers and the keys that open it (never in its repr)."""

    url: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    region: str = "us-east-1"

    def client(self):
        import boto3  # only the benchmarks and bucket creation need it
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
        )


class MinIOServer:
    """``minio server DIR`` on a free loopback port; ``bucket`` exists once it has started."""

    def __init__(
        self,
        workdir: Path,
        *,
        bucket: str = "tokenlake",
        port: int | None = None,
        keys: tuple[str, str] | None = None,
    ):
        """``keys``: the root user and password of an earlier start on ``workdir`` (else generated)."""
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.port = port or free_port()
        user, password = keys or (f"minio-{secrets.token_hex(6)}", secrets.token_urlsafe(30))
        self.endpoint = S3Endpoint(
            f"http://127.0.0.1:{self.port}", access_key_id=user, secret_access_key=password
        )
        self.process = ServiceProcess(
            "minio",
            [
                str(binary("minio")),
                "server",
                str(self.workdir / "data"),
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{free_port()}",
                "--quiet",
            ],
            self.workdir,
            ready=self._live,
            env={
                "MINIO_ROOT_USER": self.endpoint.access_key_id,
                "MINIO_ROOT_PASSWORD": self.endpoint.secret_access_key,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
                "MINIO_CALLHOME_ENABLE": "off",
            },
        )

    def _live(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint.url}/minio/health/live", timeout=2) as answer:
            return answer.status == 200

    def start(self) -> MinIOServer:
        self.process.start()
        client = self.endpoint.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if self.bucket not in existing:
            client.create_bucket(Bucket=self.bucket)
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> MinIOServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
