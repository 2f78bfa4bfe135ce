"""Configuring the lakeFS adapter: the lakectl way, clear misconfiguration errors, no leaked secrets."""

from __future__ import annotations

import base64
import logging
import socket
import traceback
from pathlib import Path

import pytest

from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.versioning.lakefs_backends import connect
from versioning import NotFound, TransientError, open_repo
from versioning.lakefs import LakeFSConfigError, LakeFSCredentials, LakeFSRepo, RetryPolicy

ENV = (
    "LAKECTL_SERVER_ENDPOINT_URL",
    "LAKECTL_CREDENTIALS_ACCESS_KEY_ID",
    "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY",
)
QUICK = RetryPolicy(attempts=2, base_delay_s=0.001, max_delay_s=0.001)


@pytest.fixture
def no_lakectl(monkeypatch, tmp_path: Path) -> Path:
    """No LAKECTL_* variables; the lakectl config file is ``tmp_path/lakectl.yaml`` (absent)."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "lakectl.yaml"
    monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(config))
    return config


def one_sentence(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.count(": ") >= 1
    return text


def test_missing_configuration_names_every_setting(no_lakectl: Path):
    with pytest.raises(LakeFSConfigError) as caught:
        LakeFSRepo.from_lakectl("demo")
    text = one_sentence(caught.value)
    assert all(name in text for name in ENV) and str(no_lakectl) in text


def test_partial_configuration_names_what_is_missing(no_lakectl: Path, monkeypatch):
    monkeypatch.setenv("LAKECTL_SERVER_ENDPOINT_URL", "http://lakefs.example:8000")
    with pytest.raises(
        LakeFSConfigError, match=r"\(LAKECTL_CREDENTIALS_ACCESS_KEY_ID, LAKECTL_CREDENTIALS_SECRET"
    ):
        open_repo("lakefs://demo")


def test_lakectl_file_is_read_and_variables_override_it(no_lakectl: Path, monkeypatch, tmp_path: Path):
    with LakeFSDouble(tmp_path / "backing") as double:
        no_lakectl.write_text(
            f"server:\n  endpoint_url: {double.endpoint}\n"
            f"credentials:\n  access_key_id: {double.access_key_id}\n  secret_access_key: stale-secret\n"
        )
        with pytest.raises(LakeFSConfigError, match="401"):
            open_repo("lakefs://demo")
        monkeypatch.setenv("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", double.secret_access_key)
        repo = open_repo("lakefs://demo")  # ensured
        repo.put("main", "a", b"via lakectl config")
        assert repo.get("main", "a") == b"via lakectl config"
        assert repr(repo) == f"LakeFSRepo(endpoint={double.endpoint!r}, repository='demo')"


def test_a_broken_lakectl_file_is_reported_without_its_content(no_lakectl: Path):
    no_lakectl.write_text(
        "server:\n  endpoint_url: http://x\ncredentials:\n  secret_access_key: [TopSecret123\n"
    )
    with pytest.raises(LakeFSConfigError, match="not valid YAML") as caught:
        LakeFSRepo.from_lakectl("demo")
    assert "TopSecret123" not in one_sentence(caught.value)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("localhost:8000", "not an http"), ("ftp://host", "not an http"), ("", "empty"),
     ("http://admin:TopSecret123@host:8000", "contains credentials")],
)  # fmt: skip
def test_bad_endpoints_are_refused(endpoint: str, expected: str):
    with pytest.raises(LakeFSConfigError, match=expected) as caught:
        LakeFSRepo.connect(endpoint, "key", "secret", "demo")
    assert "TopSecret123" not in one_sentence(caught.value)


@pytest.mark.parametrize(
    ("key", "secret", "expected"), [("", "s", "access key id"), ("k", "", "secret access key")]
)
def test_empty_credentials_are_refused(key: str, secret: str, expected: str):
    with pytest.raises(LakeFSConfigError, match=f"{expected} is empty"):
        LakeFSRepo.connect("http://localhost:8000", key, secret, "demo")


def test_bad_repository_names_are_refused():
    with pytest.raises(ValueError, match="repository name"):
        LakeFSRepo.connect("http://localhost:8000", "key", "secret", "Bad_Name")


def test_wrong_credentials_fail_at_once_with_a_clear_error(tmp_path: Path):
    with LakeFSDouble(tmp_path) as double:
        repo = LakeFSRepo.connect(
            double.endpoint, double.access_key_id, "WrongSecret987", "demo", retry=QUICK
        )
        with pytest.raises(LakeFSConfigError) as caught:
            repo.ensure()
        assert double.requests["getRepository"] == 1  # a 401 is not retried
    text = one_sentence(caught.value)
    assert "401" in text and double.endpoint in text and "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY" in text
    assert "WrongSecret987" not in "".join(traceback.format_exception(caught.value))


def test_an_unreachable_endpoint_fails_naming_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    # the port is closed now: nothing listens there
    repo = LakeFSRepo.connect(endpoint, "key", "secret", "demo", retry=QUICK)
    with pytest.raises(TransientError) as caught:
        repo.ensure()
    text = one_sentence(caught.value)
    assert endpoint in text and "unreachable" in text and "LAKECTL_SERVER_ENDPOINT_URL" in text


def test_credentials_never_appear_in_logs_reprs_or_errors(tmp_path: Path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, urllib3 and the SDK included
    faults = FaultConfig(error_rate=0.2, drop_rate=0.2, seed=4)
    with LakeFSDouble(tmp_path, faults=faults) as double:
        secret = double.secret_access_key
        token = base64.b64encode(f"{double.access_key_id}:{secret}".encode()).decode()
        repo = connect(double)
        repo.ensure()
        repo.put("main", "a", b"a")
        repo.commit("main", "c", {"k": "v"})
        errors = []
        for failing in (lambda: repo.get("main", "missing"), lambda: repo.resolve("nope")):
            with pytest.raises(NotFound) as caught:
                failing()
            errors.append(caught.value)
        double.faults = FaultConfig(error_rate=1.0)
        with pytest.raises(TransientError) as caught:
            repo.list_branches()
        errors.append(caught.value)
        assert sum(double.injected.values()) >= 1
    texts = [caplog.text, repr(repo), repr(double), repr(LakeFSCredentials(double.endpoint, "id", secret))]
    texts += ["".join(traceback.format_exception(error)) for error in errors]
    assert "retry" in caplog.text  # the retries were logged...
    for text in texts:
        assert secret not in text and token not in text  # ...without the secret


def test_an_unknown_host_is_reported_as_such():
    repo = LakeFSRepo.connect("http://lakefs.invalid:8000", "key", "secret", "demo", retry=QUICK)
    with pytest.raises(TransientError, match="cannot resolve the host name.*LAKECTL_SERVER_ENDPOINT_URL"):
        repo.ensure()


def test_a_bad_presign_setting_fails_fast_naming_the_variable(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("TOKENLAKE_LAKEFS_PRESIGN", "sometimes")
    with LakeFSDouble(tmp_path) as double, pytest.raises(LakeFSConfigError) as caught:
        connect(double)
    assert str(caught.value) == (
        "TOKENLAKE_LAKEFS_PRESIGN='sometimes' is not one of auto, true or false: set it to false where "
        "clients cannot reach the object store lakeFS writes to"
    )
    monkeypatch.setenv("TOKENLAKE_LAKEFS_PRESIGN", "False")
    with LakeFSDouble(tmp_path / "off") as double:
        assert connect(double).presign_uploads is False
