"""The port's own rules, independent of any backend: lakeFS keys versus tokenlake's safe paths."""

from __future__ import annotations

import pytest

from versioning import InvalidPath, validate_key, validate_path
from versioning.port import user_metadata, validate_metadata

LAKEFS_KEYS_THAT_ARE_NOT_SAFE_PATHS = [
    "a//b",
    "dir/",
    "/abs",
    "a/../b",
    "./a",
    "..",
    "nul\x00byte",
    "C:x",
    "\\x",
]


@pytest.mark.parametrize("key", LAKEFS_KEYS_THAT_ARE_NOT_SAFE_PATHS)
def test_a_lakefs_key_is_not_always_a_safe_path(key: str):
    assert validate_key(key) == key  # the port reads, lists and copies it
    with pytest.raises(InvalidPath):
        validate_path(key)  # tokenlake never builds it, nor turns it into a file


@pytest.mark.parametrize("path", ["raw/web/part-00000.parquet", "a", "ü/ß", "k" * 1024])
def test_safe_paths_are_lakefs_keys(path: str):
    assert validate_path(path) == validate_key(path) == path


@pytest.mark.parametrize("key", ["", "k" * 1025, "ü" * 513, "a\udcff", None])
def test_what_lakefs_refuses_both_refuse(key):
    with pytest.raises(InvalidPath):
        validate_key(key)
    with pytest.raises(InvalidPath):
        validate_path(key)


def test_lakefs_metadata_keys_are_refused_from_callers_and_hidden_from_them():
    with pytest.raises(InvalidPath, match=r"\.lakefs\."):
        validate_metadata({".lakefs.merge.strategy": "dest-wins"})
    assert validate_metadata({"lakefs.note": "x", "stage": "ingest"}) == {
        "lakefs.note": "x",
        "stage": "ingest",
    }
    assert user_metadata({".lakefs.merge.strategy": "default", "stage": "publish"}) == {"stage": "publish"}
