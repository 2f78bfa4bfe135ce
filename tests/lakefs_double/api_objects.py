"""The double's handlers for objects: upload, download (ranged), stat, list, delete."""

from __future__ import annotations

import re
from email.utils import formatdate

from tests.lakefs_double.common import ApiError, Call, Reply, not_implemented, operation, page
from versioning.port import NotFound, ObjectStat

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _object_headers(stat: ObjectStat, etag: str) -> dict[str, str]:
    return {"ETag": f'"{etag}"', "Last-Modified": formatdate(stat.mtime, usegmt=True)}


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive for a single-range header; None for the whole object; 416 if unsatisfiable."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    unsatisfiable = ApiError(416, "Requested Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
    if not match or match.groups() == ("", ""):
        raise unsatisfiable
    first, last = match.groups()
    if first == "":  # a suffix: the last N bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), size - 1 if last == "" else min(int(last), size - 1)
    if start >= size or start > end:
        raise unsatisfiable
    return start, end


def _read_object(call: Call, head: bool) -> Reply:
    if call.flag("presign"):
        raise ApiError(400, "pre-signed URLs are not supported by the local block adapter")
    repo, ref, path = call.repo, call.path_params["ref"], call.required("path")
    stat = repo.stat(ref, path)
    headers = _object_headers(stat, call.store.etag(repo, ref, stat))
    if call.headers.get("If-None-Match") == headers["ETag"]:
        return Reply(304, headers=headers)
    span = _byte_range(call.headers.get("Range"), stat.size)
    start, end = span if span is not None else (0, stat.size - 1)
    length = end - start + 1
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{stat.size}"
    status = 206 if span is not None else 200
    if head:
        return Reply(status, length=length, headers=headers)
    stream = repo.open(ref, path)
    stream.seek(start)
    return Reply(
        status, stream=stream, length=length, content_type="application/octet-stream", headers=headers
    )


@operation("getObject")
def get_object(call: Call) -> Reply:
    return _read_object(call, head=False)


@operation("headObject")
def head_object(call: Call) -> Reply:
    try:
        return _read_object(call, head=True)
    except (ApiError, NotFound) as error:
        # HEAD answers carry no body, errors included.
        if isinstance(error, ApiError):
            return Reply(error.status, headers=error.headers)
        return Reply(404)


@operation("statObject")
def stat_object(call: Call) -> Reply:
    if call.flag("presign"):
        raise ApiError(400, "pre-signed URLs are not supported by the local block adapter")
    ref = call.path_params["ref"]
    return Reply(200, json=call.stat_json(call.repo.stat(ref, call.required("path")), ref))


@operation("listObjects")
def list_objects(call: Call) -> Reply:
    repo, ref = call.repo, call.path_params["ref"]
    prefix, delimiter = call.arg("prefix") or "", call.arg("delimiter") or ""
    stats = repo.list(ref, prefix)

    def entries():
        last_prefix = None
        for stat in stats:
            cut = stat.path.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                yield call.stat_json(stat, ref, listed=True)
                continue
            common = stat.path[: cut + len(delimiter)]
            if common != last_prefix:
                last_prefix = common
                yield {
                    "path": common,
                    "path_type": "common_prefix",
                    "checksum": "",
                    "physical_address": "",
                    "mtime": 0,
                }

    return Reply(200, json=page(entries(), lambda e: e["path"], call.arg("after") or "", call.amount()))


@operation("uploadObject")
def upload_object(call: Call) -> Reply:
    content_type = call.headers.get("Content-Type", "application/octet-stream")
    if content_type.startswith("multipart/"):
        raise not_implemented("multipart/form-data upload (send application/octet-stream)")
    if call.headers.get("If-Match") or call.arg("storageClass"):
        raise not_implemented("If-Match and storageClass")
    repo, branch, path = call.repo, call.path_params["branch"], call.required("path")
    if call.headers.get("If-None-Match") == "*" and repo.exists(branch, path):
        raise ApiError(412, "Precondition failed")
    stat = repo.put(branch, path, call.stream)
    return Reply(201, json=call.stat_json(stat, branch))


@operation("deleteObject")
def delete_object(call: Call) -> Reply:
    branch = call.path_params["branch"]
    if branch not in call.repo.list_branches():
        raise ApiError(404, "branch not found")
    try:
        call.repo.delete(branch, call.required("path"))
    except NotFound:
        pass  # lakeFS stages a tombstone for any path: deleting an absent object is 204 too
    return Reply(204)


@operation("deleteObjects")
def delete_objects(call: Call) -> Reply:
    paths = call.body_field("paths")
    if not isinstance(paths, list) or len(paths) > 1000:
        raise ApiError(400, "paths must be a list of at most 1000 object paths")
    errors = []
    for path in paths:
        try:
            call.repo.delete(call.path_params["branch"], path)
        except NotFound:
            continue  # lakeFS ignores paths that are already gone
        except ValueError as invalid:
            errors.append({"path": path, "status_code": 400, "message": str(invalid)})
    return Reply(200, json={"errors": errors})  # even for a branch that is not there
