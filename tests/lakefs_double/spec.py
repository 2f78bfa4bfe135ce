"""The official lakeFS OpenAPI spec: routing table for the double and the judge of its answers.

The spec (lakeFS v1.84.0 ``api/swagger.yml``, Apache License 2.0) is read from
``shared/lakefs/openapi.yml`` beside the repository when it is there, else from the copy
next to this file (so a clone alone can run the tests); ``$TOKENLAKE_LAKEFS_SPEC`` overrides both.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.validation.request.validators import V30RequestBodyValidator, V30RequestParametersValidator
from werkzeug.datastructures import Headers, ImmutableMultiDict

BASE_PATH = "/api/v1"
_ROOT = Path(__file__).resolve().parents[2]
_CANDIDATES = (
    _ROOT.parent / "shared" / "lakefs" / "openapi.yml",
    _ROOT / "shared" / "lakefs" / "openapi.yml",
    Path(__file__).resolve().parent / "openapi.yml",
)

# The spec gives 206's Content-Range the pattern of a Range *request* header ("bytes=0-9"),
# while lakeFS (and RFC 9110) send "bytes 0-9/100", which the SDK parses for the object size.
# The double sends what the server sends; this one header is exempt from validation.
KNOWN_SPEC_DEFECTS = {("getObject", 206, "Content-Range")}


def spec_path() -> Path:
    override = os.environ.get("TOKENLAKE_LAKEFS_SPEC")
    candidates = (Path(override),) if override else _CANDIDATES
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        "the lakeFS OpenAPI spec is missing: expected shared/lakefs/openapi.yml next to (or inside) the "
        "repository, or set TOKENLAKE_LAKEFS_SPEC to its path"
    )


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str  # lowercase
    template: str  # path template under BASE_PATH, e.g. /repositories/{repository}
    pattern: re.Pattern[str]
    statuses: frozenset[str]  # documented response codes, "default" included
    needs_auth: bool
    validates_body: bool = True  # False where the spec says x-validation-exclude-body (uploads)

    @property
    def may_answer_503(self) -> bool:
        return "503" in self.statuses or "default" in self.statuses


class Spec:
    def __init__(self, path: Path):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        self.operations: list[Operation] = []
        for template, item in document["paths"].items():
            pattern = re.compile(
                "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(BASE_PATH + template)) + "$"
            )
            for method, op in item.items():
                if method == "parameters":
                    continue
                security = op.get("security", document.get("security", []))
                self.operations.append(
                    Operation(
                        operation_id=op["operationId"],
                        method=method,
                        template=template,
                        pattern=pattern,
                        statuses=frozenset(str(code) for code in op["responses"]),
                        needs_auth=bool(security),
                        validates_body=not op.get("x-validation-exclude-body", False),
                    )
                )
        # A literal segment beats a parameter: try the templates with more literal text first.
        self.operations.sort(key=lambda op: -len(re.sub(r"\{\w+\}", "", op.template)))
        self.by_id = {op.operation_id: op for op in self.operations}
        self._openapi = OpenAPI.from_file_path(str(path))
        # Parameters and body, not security: lakeFS's validator authenticates nothing
        # (NoopAuthenticationFunc); its auth middleware runs after it.
        self._parameters = V30RequestParametersValidator(self._openapi.spec)
        self._body = V30RequestBodyValidator(self._openapi.spec)

    def route(self, method: str, path: str) -> tuple[Operation, dict[str, str]] | None:
        for op in self.operations:
            if op.method == method:
                match = op.pattern.match(path)
                if match:
                    return op, match.groupdict()
        return None

    def request_errors(self, op: Operation, request: WireRequest) -> list[str]:
        """Why lakeFS's request validator (``pkg/api/serve.go``) would refuse ``request``, worded
        as kin-openapi words it; empty when the request is valid."""
        errors = [_parameter_error(error) for error in self._parameters.iter_errors(request)]
        if op.validates_body:
            errors += [
                f"request body has an error: {_detail(error)}" for error in self._body.iter_errors(request)
            ]
        return errors

    def response_errors(self, op: Operation, request: WireRequest, response: WireResponse) -> list[str]:
        errors = []
        for error in self._openapi.iter_response_errors(request, response):
            header = getattr(error, "name", None)
            if (op.operation_id, response.status_code, header) in KNOWN_SPEC_DEFECTS:
                continue
            if type(error).__name__ == "MissingData" and response.content_type == "application/octet-stream":
                continue  # an empty object has an empty body; openapi-core calls that "missing"
            errors.append(_explain(error))
        return errors


def _parameter_error(error: Exception) -> str:
    name = getattr(error, "name", None)
    location = getattr(error, "location", None) or "query"
    if name is None:
        return f"request has an error: {_detail(error)}"
    return f'parameter "{name}" in {location} has an error: {_detail(error)}'


def _detail(error: Exception) -> str:
    """The most specific reason openapi-core gives: a schema error's message, else the cause's."""
    cause = error.__cause__
    schema_errors = getattr(cause, "schema_errors", None)
    if schema_errors:
        return "; ".join(
            f'Error at "/{"/".join(map(str, e.path))}": {e.message}' if e.path else str(e.message)
            for e in schema_errors
        )
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(error)


def _explain(error: Exception) -> str:
    parts = [f"{type(error).__name__}: {error}"]
    cause = error.__cause__
    while cause is not None:
        parts.append(f"{type(cause).__name__}: {cause}")
        schema_errors = getattr(cause, "schema_errors", None)
        if schema_errors:
            parts.extend(str(e.message) for e in schema_errors)
        cause = cause.__cause__
    return " <- ".join(parts)


@functools.cache
def load_spec() -> Spec:
    """Parsed once per process: building the validator takes about a second."""
    return Spec(spec_path())


class WireRequest:
    """What openapi-core needs to know of a request the double received."""

    def __init__(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: bytes | None,
        content_type: str,
    ):
        self.method = method
        self.path = path
        self.host_url = "http://127.0.0.1"
        self.body = body
        self.content_type = content_type
        self.parameters = RequestParameters(
            query=ImmutableMultiDict([(k, v) for k, values in query.items() for v in values]),
            header=Headers(headers),
            cookie=ImmutableMultiDict(),
            path={},
        )


class WireResponse:
    """What openapi-core needs to know of a response the double sent."""

    def __init__(self, status_code: int, headers: dict[str, str], data: bytes):
        self.status_code = status_code
        self.headers = Headers(headers)
        self.content_type = headers.get("Content-Type", "")
        self.data = data
