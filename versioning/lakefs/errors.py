"""Turning lakeFS SDK and network failures into the port's errors, and retrying the transient ones.

Two exception families come out of the official SDK: ``lakefs.exceptions.ServerException``
(the high-level wrapper) and ``lakefs_sdk.ApiException`` (generated client, and the wrapper
calls that forget to convert). Network failures surface as raw ``urllib3`` errors, because
the adapter turns urllib3's own silent retries off so that retrying happens in one place.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import lakefs_sdk
import urllib3
from lakefs.exceptions import ServerException
from pydantic import ValidationError

from versioning.lakefs.config import ACCESS_KEY_ENV, SECRET_KEY_ENV, LakeFSConfigError
from versioning.port import (
    Conflict,
    HookFailed,
    InvalidPath,
    NoChanges,
    NotFound,
    RepoError,
    TransientError,
)

log = logging.getLogger("versioning.lakefs")
T = TypeVar("T")

# One failed hook in lakeFS's 412 answer (pkg/actions/service.go: a multierror of
# "hook run id '<id>' failed on action '<action>' hook '<hook>': <error>", the Lua error wrapped
# as "action failed: <message>" and followed by its stack traceback on the next lines).
_FAILED_HOOK = re.compile(
    r"failed on action '(?P<action>[^']*)' hook '(?P<hook>[^']*)': (?:action failed: )?(?P<why>[^\n]*)"
)


def hook_refusal(reason: str) -> str:
    """lakeFS's multi-line pre-merge refusal as one sentence, worded as the local repository's:
    ``pre-merge hook aborted: action 'A' hook 'H': <the hook's message>``."""
    failures = [
        f"action {m['action']!r} hook {m['hook']!r}: {m['why'].strip()}"
        for m in _FAILED_HOOK.finditer(reason)
    ]
    if not failures:
        return " ".join(reason.split())
    return "pre-merge hook aborted: " + "; ".join(failures)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transient lakeFS failures.

    The n-th retry waits between half and all of ``min(max_delay_s, base_delay_s * 2**(n-1))``;
    after ``attempts`` failed attempts the last failure is raised as TransientError.
    """

    attempts: int = 6
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError(f"invalid retry policy {self}: attempts >= 1 and non-negative delays required")

    def delay(self, failures: int, rng: random.Random) -> float:
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (failures - 1))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class Failure:
    """What went wrong with one request: the HTTP status (None: no response) and a secret-free reason."""

    status: int | None
    reason: str
    unreachable: bool = False  # no connection could be made (refused, unresolvable host, connect timeout)

    @property
    def transient(self) -> bool:
        return self.status is None or self.status in (408, 429) or self.status >= 500


def describe(exc: BaseException) -> Failure | None:
    """The failure behind an SDK or network exception; None for anything else (a bug, not a failure)."""
    if isinstance(exc, ServerException):
        message = exc.body.get("message") if isinstance(exc.body, dict) else None
        return Failure(exc.status_code or None, str(message or exc.reason or "no reason given"))
    if isinstance(exc, lakefs_sdk.ApiException):
        return Failure(exc.status or None, _body_message(exc.body) or str(exc.reason or "no reason given"))
    if isinstance(exc, urllib3.exceptions.HTTPError):
        cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
        unreachable = isinstance(
            cause, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)
        )
        return Failure(None, _network_reason(exc), unreachable)
    if isinstance(exc, OSError):
        return Failure(None, exc.strerror or type(exc).__name__, isinstance(exc, ConnectionRefusedError))
    if isinstance(exc, (ValidationError, json.JSONDecodeError)):
        # A proxy or a wrong URL answered with something that is not the lakeFS API.
        return Failure(
            502, "the server's answer is not a lakeFS API response (is the endpoint a lakeFS server?)"
        )
    return None


def _body_message(body: object) -> str | None:
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return str(message) if message else None


def _network_reason(exc: urllib3.exceptions.HTTPError) -> str:
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.NameResolutionError):  # a kind of NewConnectionError
        return "cannot resolve the host name"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return "cannot connect (connection refused or host unreachable)"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return "timed out"
    if isinstance(exc, (urllib3.exceptions.ProtocolError, urllib3.exceptions.IncompleteRead)):
        return "connection dropped before a complete response"
    return type(exc).__name__


class ConflictFound(Conflict):
    """lakeFS answered 409: the ref exists, or (for a merge) both sides changed the same paths."""


class ErrorMapper:
    """Builds the port error for a failure of one repository's operation."""

    def __init__(self, endpoint: str, repository: str):
        self.endpoint = endpoint
        self.repository = repository

    def to_port(self, failure: Failure, action: str) -> RepoError:
        status, reason = failure.status, failure.reason
        where = f"lakeFS repository {self.repository!r} at {self.endpoint}"
        if failure.transient:
            if status is None and not failure.unreachable:
                return TransientError(
                    f"cannot {action}: the connection to lakeFS at {self.endpoint} failed ({reason})"
                )
            if status is None:
                return TransientError(
                    f"cannot {action}: lakeFS at {self.endpoint} is unreachable ({reason}); check "
                    "the endpoint (LAKECTL_SERVER_ENDPOINT_URL) and that the server is running"
                )
            return TransientError(f"cannot {action}: {where} answered HTTP {status} ({reason})")
        if status == 401:
            return LakeFSConfigError(
                f"lakeFS at {self.endpoint} rejected the credentials (HTTP 401): check {ACCESS_KEY_ENV} "
                f"and {SECRET_KEY_ENV} (or credentials in ~/.lakectl.yaml)"
            )
        lowered = reason.lower()
        if status == 403 and "default branch" in lowered:
            return Conflict(f"cannot {action}: {reason} ({where})")
        if status == 403:
            return RepoError(
                f"cannot {action}: {where} forbids it (HTTP 403: {reason}); check permissions and branch protection"
            )
        if status == 404:
            return NotFound(f"cannot {action}: {reason} ({where})")
        if status == 400 and "no changes" in lowered:
            return NoChanges(f"cannot {action}: no changes ({where})")
        if status == 409:
            return ConflictFound(f"cannot {action}: {reason} ({where})")
        if status == 412 and "hook" in lowered:  # a pre-merge (or pre-commit) action refused
            return HookFailed(f"cannot {action}: {hook_refusal(reason)} ({where})")
        if status == 412 or (
            status == 400 and ("dirty branch" in lowered or "uncommitted changes" in lowered)
        ):
            return Conflict(f"cannot {action}: {reason} ({where})")
        if status == 400:
            return InvalidPath(f"cannot {action}: lakeFS refused the request as invalid ({reason}; {where})")
        return RepoError(f"cannot {action}: {where} answered HTTP {status} ({reason})")


class Retrier:
    """Runs lakeFS calls under a RetryPolicy and maps what finally fails to a port error."""

    def __init__(self, policy: RetryPolicy, errors: ErrorMapper, rng: random.Random | None = None):
        self.policy = policy
        self.errors = errors
        self._rng = rng or random.Random()

    def port_error(self, exc: BaseException, action: str) -> RepoError | None:
        failure = describe(exc)
        return None if failure is None else self.errors.to_port(failure, action)

    def backoff(self, failures: int, action: str, error: RepoError) -> None:
        """Sleep before retry number ``failures``, or raise ``error`` when the attempts are spent."""
        if failures >= self.policy.attempts:
            raise error
        delay = self.policy.delay(failures, self._rng)
        log.warning("lakeFS: %s; retry %d/%d in %.2fs", error, failures, self.policy.attempts - 1, delay)
        time.sleep(delay)

    def call(self, action: str, fn: Callable[[], T]) -> T:
        """Run an idempotent call, retrying transient failures."""
        failures = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                error = self.port_error(exc, action)
                if error is None:
                    raise
                if not isinstance(error, TransientError):
                    raise error from exc
                failures += 1
                self.backoff(failures, action, error)

    def write_once(self, action: str, write: Callable[[], T], applied: Callable[[], T | None]) -> T | None:
        """Run a write that must not happen twice.

        A transient failure may hide a write that did take effect (the response was lost),
        so before every retry ``applied()`` looks for the write's trace (a marker in commit
        metadata, a branch at the expected commit, ...) and returns its result if found.
        A retry refused as NoChanges/Conflict/NotFound is the trace of an earlier attempt
        that raced the check; ``applied()`` decides.
        """
        failures = 0
        while True:
            try:
                return write()
            except Exception as exc:
                error = self.port_error(exc, action)
                if error is None:
                    raise
                if failures and isinstance(error, (NoChanges, Conflict, NotFound)):
                    result = self.call(f"check whether {action} took effect", applied)
                    if result is not None:
                        return result
                    raise error from exc
                if not isinstance(error, TransientError):
                    raise error from exc
                failures += 1
                result = self.call(f"check whether {action} took effect", applied)
                if result is not None:
                    return result
                self.backoff(failures, action, error)
