"""LakeFSDouble: a real HTTP server on 127.0.0.1 speaking the lakeFS ``/api/v1`` wire protocol.

Requests are routed by the official OpenAPI spec's path templates to operation handlers
(``api_refs``, ``api_objects``) that translate them to ``versioning.local.LocalRepo`` calls
(one LocalRepo per repository under the backing directory) and translate the port's errors
back to lakeFS's status codes and messages.

In validation mode (the default) the double does what lakeFS's request validator does
(``pkg/api/serve.go``): a request that breaks the spec (a parameter out of its bounds, a
body that does not match its schema) is answered 400 before authentication and before any
handler runs, and is recorded in ``rejected``. Every response is checked against the spec
too; a response that breaks it, a request to an endpoint outside the spec and a handler
crash are the double's own faults and are recorded in ``violations``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
import json
import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.lakefs_double import api_objects, api_refs  # noqa: F401 - they register the operations
from tests.lakefs_double.common import OPERATIONS, ApiError, Call, Reply, RepositoryStore
from tests.lakefs_double.faults import Fault, FaultConfig, FaultInjector
from tests.lakefs_double.not_found import lakefs_not_found
from tests.lakefs_double.spec import Operation, WireRequest, WireResponse, load_spec
from versioning.port import Conflict, HookFailed, InvalidPath, NoChanges, NotFound, RepoError, TransientError

log = logging.getLogger("tests.lakefs_double")
_CHUNK = 1024 * 1024


class LakeFSDouble:
    """``with LakeFSDouble(backing_dir, faults=FaultConfig(...)) as double:`` serves ``double.endpoint``."""

    def __init__(self, backing_dir: Path, faults: FaultConfig | None = None, *, validate: bool = True):
        self.store = RepositoryStore(Path(backing_dir))
        self.access_key_id = "AKIAJ" + secrets.token_hex(8).upper()
        self.secret_access_key = secrets.token_urlsafe(30)
        self.validate = validate
        self.spec = load_spec()
        self.requests: Counter[str] = Counter()  # operationId -> requests received
        self.violations: list[str] = []  # the double's faults: bad responses, unknown endpoints, crashes
        self.rejected: list[str] = []  # the client's faults: requests refused by the spec validator
        # Tests: called with (operationId, query) of every routed request before its fault is drawn,
        # so a test can start an outage at an event (a given object's read) instead of a time.
        self.on_request: Callable[[str, dict[str, list[str]]], None] | None = None
        self._injector = FaultInjector(faults or FaultConfig())
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"LakeFSDouble(endpoint={self.endpoint!r}, faults={self.faults})"

    @property
    def endpoint(self) -> str:
        if self._server is None:
            return "http://127.0.0.1:<not started>"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def faults(self) -> FaultConfig:
        return self._injector.config

    @faults.setter
    def faults(self, config: FaultConfig) -> None:
        """Switch fault injection at run time (a fresh seeded sequence starts)."""
        self._injector = FaultInjector(config)

    @property
    def injected(self) -> Counter[str]:
        """Faults injected since the last ``faults`` assignment, by kind."""
        return self._injector.injected

    def __enter__(self) -> LakeFSDouble:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.double = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="lakefs-double", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # what the handler calls

    def record(self, violation: str) -> None:
        with self._lock:
            self.violations.append(violation)
        log.warning("lakeFS double: %s", violation)

    def reject(self, operation_id: str, reason: str) -> None:
        with self._lock:
            self.rejected.append(f"{operation_id}: {reason}")
        log.info("lakeFS double: refused %s: %s", operation_id, reason)

    def count(self, operation_id: str) -> None:
        with self._lock:
            self.requests[operation_id] += 1

    def observe(self, operation_id: str, query: dict[str, list[str]]) -> None:
        hook = self.on_request
        if hook is not None:
            hook(operation_id, query)

    def authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(user, self.access_key_id) & hmac.compare_digest(
            password, self.secret_access_key
        )

    def dispatch(self, call: Call) -> Reply:
        handler = OPERATIONS.get(call.op.operation_id)
        if handler is None:
            self.record(f"{call.op.operation_id} was called but the double does not implement it")
            return _error(
                ApiError(501, f"{call.op.operation_id} is not implemented by the lakeFS API double")
            )
        try:
            return handler(call)
        except (ApiError, RepoError) as error:
            if isinstance(error, NotFound) or (isinstance(error, ApiError) and error.status == 404):
                return Reply(404, json={"message": lakefs_not_found(call)})
            return _error(error)


def _error(error: ApiError | RepoError) -> Reply:
    """lakeFS's answer to a port error (pkg/api/apierrors: status codes and messages)."""
    if isinstance(error, ApiError):
        return Reply(error.status, json={"message": error.message}, headers=error.headers)
    text = str(error)
    if isinstance(error, HookFailed):  # graveler.HookAbortError
        status, message = 412, text
    elif isinstance(error, NoChanges):
        status, message = 400, f"no changes: {text}"
    elif isinstance(error, Conflict) and "uncommitted changes" in text:
        status, message = 400, f"uncommitted changes (dirty branch): {text}"
    elif isinstance(error, Conflict):
        status, message = 409, text
    elif isinstance(error, InvalidPath):
        status, message = 400, text
    elif isinstance(error, TransientError):
        status, message = 503, text
    else:
        status, message = 500, text
    return Reply(status, json={"message": message})


class _RequestBody(io.RawIOBase):
    """The request body, decoded from Content-Length or chunked framing."""

    def __init__(self, rfile: Any, headers: Any):
        super().__init__()
        self._rfile = rfile
        self._chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._left = 0 if self._chunked else int(headers.get("Content-Length") or 0)
        self.exhausted = not self._chunked and self._left == 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.exhausted:
            return 0
        if self._chunked and self._left == 0:
            self._left = int(self._rfile.readline().split(b";")[0].strip() or b"0", 16)
            if self._left == 0:
                while self._rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self.exhausted = True
                return 0
        count = min(len(buffer), self._left)
        data = self._rfile.read(count)
        if len(data) < count:
            raise ConnectionError("the client closed the connection in the middle of the request body")
        buffer[:count] = data
        self._left -= count
        if self._left == 0:
            if self._chunked:
                self._rfile.readline()
            else:
                self.exhausted = True
        return count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle's algorithm holds the
        # body until the client's delayed ACK (40 ms) arrives.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("lakeFS double: " + format, *args)  # the request line only: never headers

    def do_GET(self) -> None:
        self._serve("get")

    def do_HEAD(self) -> None:
        self._serve("head")

    def do_POST(self) -> None:
        self._serve("post")

    def do_PUT(self) -> None:
        self._serve("put")

    def do_DELETE(self) -> None:
        self._serve("delete")

    def do_PATCH(self) -> None:
        self._serve("patch")

    def _serve(self, method: str) -> None:
        double: LakeFSDouble = self.server.double  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        body = _RequestBody(self.rfile, self.headers)
        routed = double.spec.route(method, url.path)
        if routed is None:
            double.record(f"{method.upper()} {url.path} is not an endpoint of the lakeFS API spec")
            self._write(method, None, Reply(404, json={"message": "no such API endpoint"}), None)
            self.close_connection = True
            return
        op, raw_params = routed
        double.count(op.operation_id)
        double.observe(op.operation_id, query)
        faults = double.faults
        if faults.latency_s:
            time.sleep(faults.latency_s)
        fault = double._injector.draw(op.operation_id, op.may_answer_503)
        if fault is Fault.DROP_BEFORE:
            self.close_connection = True
            return
        wire = None
        if fault is Fault.ERROR:
            reply = Reply(503, json={"message": "injected fault: service unavailable, try again later"})
        else:
            reply, wire = self._handle(double, op, raw_params, query, body)
            if reply is None:
                return
        if fault is Fault.DROP_AFTER:
            if reply.stream is not None:
                reply.stream.close()
            self.close_connection = True
            return
        if not body.exhausted:
            self.close_connection = True  # an unread body would be taken for the next request
            reply.headers["Connection"] = "close"
        self._write(method, op, reply, wire)

    def _handle(self, double: LakeFSDouble, op: Operation, raw_params: dict[str, str], query, body):
        json_body, raw = None, None
        if "json" in self.headers.get("Content-Type", ""):
            raw = body.read()
            try:
                json_body = json.loads(raw) if raw else None
            except ValueError:
                return Reply(
                    400, json={"message": "request body has an error: failed to decode request body"}
                ), None
        wire = WireRequest(
            op.method,
            urlsplit(self.path).path,
            query,
            dict(self.headers.items()),
            raw,
            self.headers.get("Content-Type", ""),
        )
        if double.validate:
            errors = double.spec.request_errors(op, wire)
            if errors:
                double.reject(op.operation_id, errors[0])
                return Reply(400, json={"message": errors[0]}), wire
        if op.needs_auth and not double.authorized(self.headers.get("Authorization")):
            return Reply(401, json={"message": "error authenticating request"}), wire
        call = Call(
            op=op,
            path_params={name: unquote(value) for name, value in raw_params.items()},
            query=query,
            headers=self.headers,
            json_body=json_body,
            stream=io.BufferedReader(body, _CHUNK),
            store=double.store,
        )
        try:
            return double.dispatch(call), wire
        except ConnectionError:
            self.close_connection = True  # the client went away mid-upload
            return None, None
        except Exception as crash:
            double.record(f"{op.operation_id} crashed: {type(crash).__name__}: {crash}")
            return Reply(500, json={"message": f"internal error: {type(crash).__name__}"}), wire

    def _write(self, method: str, op: Operation | None, reply: Reply, wire: WireRequest | None) -> None:
        double: LakeFSDouble = self.server.double  # type: ignore[attr-defined]
        headers = dict(reply.headers)
        first = b""
        if reply.json is not None:
            first = (json.dumps(reply.json) + "\n").encode()
            headers["Content-Type"] = "application/json"
        elif reply.body is not None:
            first = reply.body
            headers["Content-Type"] = reply.content_type or "application/octet-stream"
        elif reply.stream is not None:
            first = reply.stream.read(min(_CHUNK, reply.length))
            headers["Content-Type"] = reply.content_type or "application/octet-stream"
        length = reply.length if reply.stream is not None or method == "head" else len(first)
        if method == "head":
            first = b""
            headers.pop("Content-Type", None)
        if reply.status != 204 and reply.status != 304:
            headers["Content-Length"] = str(length)
        if double.validate and op is not None:
            request = wire or WireRequest(op.method, urlsplit(self.path).path, {}, {}, None, "")
            for error in double.spec.response_errors(op, request, WireResponse(reply.status, headers, first)):
                double.record(f"response {op.operation_id} {reply.status}: {error}")
        try:
            self.send_response(reply.status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if method != "head":
                self.wfile.write(first)
                if reply.stream is not None:
                    left = reply.length - len(first)
                    while left > 0:
                        chunk = reply.stream.read(min(_CHUNK, left))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        left -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            if reply.stream is not None:
                reply.stream.close()
