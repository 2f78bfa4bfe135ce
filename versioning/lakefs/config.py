"""Where the lakeFS adapter finds its server and credentials: explicit values or the lakectl way.

lakectl's own precedence applies: each ``LAKECTL_*`` environment variable overrides the
matching key of the lakectl YAML file (``$LAKECTL_CONFIG_FILE``, else ``~/.lakectl.yaml``).
Error messages name the setting to fix and never echo a secret or the file's content.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from versioning.port import RepoError

ENDPOINT_ENV = "LAKECTL_SERVER_ENDPOINT_URL"
ACCESS_KEY_ENV = "LAKECTL_CREDENTIALS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"
CONFIG_FILE_ENV = "LAKECTL_CONFIG_FILE"
NAMESPACE_PREFIX_ENV = "TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"
DEFAULT_NAMESPACE_PREFIX = "local://tokenlake"
PRESIGN_ENV = "TOKENLAKE_LAKEFS_PRESIGN"
_PRESIGN_VALUES = {"auto": None, "true": True, "1": True, "false": False, "0": False}


class LakeFSConfigError(RepoError):
    """lakeFS is misconfigured (endpoint, credentials, config file); the message says what to fix."""


@dataclass(frozen=True)
class LakeFSCredentials:
    """Where lakeFS is and who we are; the secret stays out of the repr."""

    endpoint: str
    access_key_id: str
    secret_access_key: str = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", check_endpoint(self.endpoint))
        if not isinstance(self.access_key_id, str) or not self.access_key_id.strip():
            raise LakeFSConfigError(f"the lakeFS access key id is empty: set {ACCESS_KEY_ENV}")
        if not isinstance(self.secret_access_key, str) or not self.secret_access_key:
            raise LakeFSConfigError(f"the lakeFS secret access key is empty: set {SECRET_KEY_ENV}")


def check_endpoint(endpoint: str) -> str:
    """The endpoint without a trailing '/', or LakeFSConfigError if it is not a plain http(s) URL."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise LakeFSConfigError(
            f"the lakeFS endpoint is empty: set {ENDPOINT_ENV}, e.g. http://localhost:8000"
        )
    parsed = urlsplit(endpoint.strip())
    if parsed.username is not None or parsed.password is not None:
        # Never echo this URL: it carries a secret.
        raise LakeFSConfigError(
            "the lakeFS endpoint URL contains credentials: remove them from the URL and set "
            f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} instead"
        )
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise LakeFSConfigError(
            f"the lakeFS endpoint {endpoint!r} is not an http(s) URL: set {ENDPOINT_ENV} like http://localhost:8000"
        )
    return endpoint.strip().rstrip("/")


def default_config_file(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(CONFIG_FILE_ENV) or Path.home() / ".lakectl.yaml")


def lakectl_credentials(
    environ: Mapping[str, str] | None = None, config_file: Path | None = None
) -> LakeFSCredentials:
    """Endpoint and credentials from the ``LAKECTL_*`` variables and the lakectl YAML file."""
    environ = os.environ if environ is None else environ
    path = config_file or default_config_file(environ)
    from_file = _read_lakectl_file(path)
    values = {
        ENDPOINT_ENV: environ.get(ENDPOINT_ENV) or from_file.get("server.endpoint_url"),
        ACCESS_KEY_ENV: environ.get(ACCESS_KEY_ENV) or from_file.get("credentials.access_key_id"),
        SECRET_KEY_ENV: environ.get(SECRET_KEY_ENV) or from_file.get("credentials.secret_access_key"),
    }
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise LakeFSConfigError(
            f"lakeFS is not configured ({', '.join(missing)} not set): set {ENDPOINT_ENV}, {ACCESS_KEY_ENV} "
            f"and {SECRET_KEY_ENV}, or write server.endpoint_url, credentials.access_key_id and "
            f"credentials.secret_access_key to {path}"
        )
    return LakeFSCredentials(
        endpoint=values[ENDPOINT_ENV],
        access_key_id=values[ACCESS_KEY_ENV],
        secret_access_key=values[SECRET_KEY_ENV],
    )


def namespace_prefix(environ: Mapping[str, str] | None = None) -> str:
    """Where new repositories put their data: ``$TOKENLAKE_LAKEFS_STORAGE_NAMESPACE`` or ``local://tokenlake``."""
    environ = os.environ if environ is None else environ
    return (environ.get(NAMESPACE_PREFIX_ENV) or DEFAULT_NAMESPACE_PREFIX).rstrip("/")


def presign_setting(environ: Mapping[str, str] | None = None) -> bool | None:
    """``$TOKENLAKE_LAKEFS_PRESIGN``: true, false, or auto (unset: the server's blockstore decides)."""
    environ = os.environ if environ is None else environ
    value = environ.get(PRESIGN_ENV, "auto").strip().lower()
    if value not in _PRESIGN_VALUES:
        raise LakeFSConfigError(
            f"{PRESIGN_ENV}={value!r} is not one of auto, true or false: set it to false where "
            "clients cannot reach the object store lakeFS writes to"
        )
    return _PRESIGN_VALUES[value]


def _read_lakectl_file(path: Path) -> dict[str, str]:
    """The lakectl keys we use, flattened ('server.endpoint_url' -> value); {} if the file is absent."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise LakeFSConfigError(
            f"cannot read the lakectl config {path} ({exc.strerror}): fix its permissions or set {CONFIG_FILE_ENV}"
        ) from None
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        # The parser's message quotes the offending line, which may hold the secret.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise LakeFSConfigError(
            f"the lakectl config {path} is not valid YAML{where}: fix it or set the LAKECTL_* variables"
        ) from None
    if not isinstance(document, dict):
        raise LakeFSConfigError(f"the lakectl config {path} is not a YAML mapping: fix it or remove it")
    flat: dict[str, str] = {}
    for section, keys in (
        ("server", ("endpoint_url",)),
        ("credentials", ("access_key_id", "secret_access_key")),
    ):
        block = document.get(section) or {}
        if not isinstance(block, dict):
            raise LakeFSConfigError(
                f"the lakectl config {path} has a '{section}' that is not a mapping: fix it"
            )
        for key in keys:
            value = block.get(key)
            if value is not None and not isinstance(value, str):
                raise LakeFSConfigError(
                    f"the lakectl config {path} has a non-string {section}.{key}: quote it"
                )
            if value:
                flat[f"{section}.{key}"] = value
    return flat
