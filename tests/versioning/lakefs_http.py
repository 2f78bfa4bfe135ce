"""A raw HTTP client of the lakeFS API for the behaviour suite: ``requests``, no SDK, no adapter.

``Server`` is an endpoint with credentials (the API double, or a real lakeFS); ``Repo`` is
one repository on it with the few calls the tests repeat. Every call returns the
``requests.Response`` itself, so a test asserts the status code and body lakeFS sends.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from tests.lakefs_double import LakeFSDouble

NAMESPACE_PREFIX_ENV = "TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"  # as versioning.lakefs.config reads it
OCTET_STREAM = {"Content-Type": "application/octet-stream"}


def segment(name: str) -> str:
    """A ref, tag or branch name as one URL path segment."""
    return quote(name, safe="")


@dataclass
class Server:
    endpoint: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    double: LakeFSDouble | None = None  # set when the server is the API double
    namespace_prefix: str | None = None  # where test repositories go (else the variable's, or local://)
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> requests.Response:
        return self.session.request(
            method,
            f"{self.endpoint}/api/v1{path}",
            params=params,
            json=json,
            data=data,
            headers=headers,
            auth=(self.access_key_id, self.secret_access_key) if auth else None,
            timeout=60,
        )

    def namespace(self, name: str) -> str:
        """A storage namespace no repository has used (lakeFS never reuses one)."""
        prefix = (
            self.namespace_prefix or os.environ.get(NAMESPACE_PREFIX_ENV) or "local://tokenlake-behaviour"
        )
        return f"{prefix.rstrip('/')}/{name}-{uuid.uuid4().hex[:8]}"

    def create_repo(self, name: str, namespace: str) -> requests.Response:
        return self.request(
            "POST",
            "/repositories",
            json={"name": name, "storage_namespace": namespace, "default_branch": "main"},
        )


@dataclass
class Repo:
    server: Server
    name: str

    def call(self, method: str, path: str = "", **options: Any) -> requests.Response:
        return self.server.request(method, f"/repositories/{self.name}{path}", **options)

    def upload(self, branch: str, path: str, data: bytes) -> requests.Response:
        return self.call(
            "POST",
            f"/branches/{segment(branch)}/objects",
            params={"path": path},
            data=data,
            headers=OCTET_STREAM,
        )

    def commit(self, branch: str, message: str = "commit", **fields: Any) -> requests.Response:
        return self.call("POST", f"/branches/{segment(branch)}/commits", json={"message": message, **fields})

    def committed(self, branch: str, files: dict[str, bytes], message: str = "commit") -> str:
        """Upload ``files`` and commit them; the new commit id (asserting every answer)."""
        for path, data in files.items():
            assert self.upload(branch, path, data).status_code == 201
        response = self.commit(branch, message)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def create_branch(self, name: str, source: str = "main") -> requests.Response:
        return self.call("POST", "/branches", json={"name": name, "source": source})

    def create_tag(self, tag: str, ref: str = "main") -> requests.Response:
        return self.call("POST", "/tags", json={"id": tag, "ref": ref})

    def head(self, branch: str) -> str:
        response = self.call("GET", f"/branches/{segment(branch)}")
        assert response.status_code == 200, response.text
        return response.json()["commit_id"]

    def get_commit(self, ref: str) -> dict[str, Any]:
        response = self.call("GET", f"/commits/{segment(ref)}")
        assert response.status_code == 200, response.text
        return response.json()

    def get_object(self, ref: str, path: str) -> requests.Response:
        return self.call("GET", f"/refs/{segment(ref)}/objects", params={"path": path})

    def list_objects(self, ref: str, **params: Any) -> requests.Response:
        return self.call("GET", f"/refs/{segment(ref)}/objects/ls", params=params)

    def uncommitted(self, branch: str) -> list[tuple[str, str]]:
        """(type, path) of each uncommitted change, as lakeFS's branch diff lists them."""
        response = self.call("GET", f"/branches/{segment(branch)}/diff")
        assert response.status_code == 200, response.text
        return [(entry["type"], entry["path"]) for entry in response.json()["results"]]

    def merge(self, source: str, destination: str, **fields: Any) -> requests.Response:
        return self.call("POST", f"/refs/{segment(source)}/merge/{segment(destination)}", json=fields)

    def revert(self, branch: str, **fields: Any) -> requests.Response:
        return self.call("POST", f"/branches/{segment(branch)}/revert", json=fields)

    def hard_reset(self, branch: str, ref: str) -> requests.Response:
        return self.call("PUT", f"/branches/{segment(branch)}/hard_reset", params={"ref": ref})


def message(response: requests.Response) -> str:
    """The ``message`` of a lakeFS error answer (pkg/api/controller.go writeError)."""
    return str(response.json().get("message", ""))
