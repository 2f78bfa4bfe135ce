"""``tokenlake repo ...``: inspect the dataset repository, and install the publish guard.

    tokenlake repo log [REF] [--limit N]     commits reachable from REF, newest first
    tokenlake repo branches                  branch -> head commit
    tokenlake repo tags                      tag -> commit
    tokenlake repo ls REF [PREFIX]           objects at REF (a branch shows staged changes)
    tokenlake repo show REF:PATH             the object's bytes on stdout
    tokenlake repo diff A B [--prefix P]     what changes A into B
    tokenlake repo install-hooks             upload and commit the pre-merge action guarding main

Every command takes ``--json`` (for ``show``: the object's metadata instead of its bytes).
The repository is the top-level ``--repo`` (a directory or ``lakefs://<repository>``);
only ``install-hooks`` writes (a commit on main), and creates the repository if it is not there yet,
so that the guard is in place before the first curate run; the others never create one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from formats.layout import MAIN as DEFAULT_REF
from versioning import Commit, DataRepo

SHORT_ID = 12


def register(subparsers: argparse._SubParsersAction) -> None:
    repo = subparsers.add_parser(
        "repo", help="inspect the dataset repository: log, branches, tags, ls, show, diff"
    )
    commands = repo.add_subparsers(dest="repo_command", metavar="SUBCOMMAND", required=True)

    log = commands.add_parser("log", help="commits reachable from REF, newest first")
    log.add_argument("ref", metavar="REF", nargs="?", default=DEFAULT_REF, help="default: main")
    log.add_argument("--limit", type=_non_negative, default=None, metavar="N", help="show at most N commits")
    log.set_defaults(handler=run_log)

    commands.add_parser("branches", help="branches and their head commits").set_defaults(handler=run_branches)
    commands.add_parser("tags", help="tags and their commits").set_defaults(handler=run_tags)

    ls = commands.add_parser("ls", help="objects at REF under PREFIX (a branch includes staged changes)")
    ls.add_argument("ref", metavar="REF")
    ls.add_argument("prefix", metavar="PREFIX", nargs="?", default="")
    ls.set_defaults(handler=run_ls)

    show = commands.add_parser("show", help="write the object REF:PATH to stdout")
    show.add_argument("target", metavar="REF:PATH", help="e.g. main:mix.json or v1:shards/manifest.json")
    show.set_defaults(handler=run_show)

    diff = commands.add_parser("diff", help="what changes commit A into commit B (two-dot)")
    diff.add_argument("left", metavar="A")
    diff.add_argument("right", metavar="B")
    diff.add_argument("--prefix", default="", help="only paths starting with this prefix")
    diff.set_defaults(handler=run_diff)

    hooks = commands.add_parser(
        "install-hooks",
        help="upload and commit the lakeFS pre-merge action that refuses ungated merges into main",
    )
    hooks.set_defaults(handler=run_install_hooks)

    for command in commands.choices.values():
        command.add_argument("--json", action="store_true", help="print JSON")


def run_log(args: argparse.Namespace) -> int:
    commits = list(_open(args).log(args.ref, limit=args.limit))
    if args.json:
        _print_json([_commit_json(c) for c in commits])
        return 0
    rows = [
        (
            c.id[:SHORT_ID],
            _when(c.created),
            "merge" if len(c.parents) > 1 else "",
            c.message,
            _metadata_text(c),
        )
        for c in commits
    ]
    print(format_table(("commit", "created (UTC)", "kind", "message", "stage, counts, gate"), rows))
    if any(c.metadata for c in commits):
        print("(every metadata field of each commit: --json)")
    return 0


def run_branches(args: argparse.Namespace) -> int:
    return _print_refs(args, _open(args).list_branches(), "branch")


def run_tags(args: argparse.Namespace) -> int:
    return _print_refs(args, _open(args).list_tags(), "tag")


def run_ls(args: argparse.Namespace) -> int:
    stats = list(_open(args).list(args.ref, args.prefix))
    if args.json:
        _print_json([asdict(s) for s in stats])
        return 0
    rows = [(s.path, s.size, s.checksum[:SHORT_ID], _when(s.mtime)) for s in stats]
    print(format_table(("path", "size", "checksum", "modified (UTC)"), rows))
    total = sum(s.size for s in stats)
    print(
        f"{len(stats)} object(s), {total} bytes at {args.ref}{f' under {args.prefix!r}' if args.prefix else ''}"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    ref, separator, path = args.target.partition(":")
    if not separator or not ref or not path:
        raise ValueError(f"expected REF:PATH (e.g. main:mix.json), got {args.target!r}")
    repo = _open(args)
    if args.json:
        _print_json({"ref": ref, "commit_id": repo.resolve(ref), **asdict(repo.stat(ref, path))})
        return 0
    with repo.open(ref, path) as reader:
        sys.stdout.flush()
        shutil.copyfileobj(reader, sys.stdout.buffer, 1 << 20)
        sys.stdout.buffer.flush()
    return 0


def run_diff(args: argparse.Namespace) -> int:
    changes = _open(args).diff(args.left, args.right, prefix=args.prefix)
    if args.json:
        _print_json([asdict(c) for c in changes])
        return 0
    if changes:
        print(format_table(("change", "path"), [(c.kind, c.path) for c in changes]))
    counts = {kind: sum(c.kind == kind for c in changes) for kind in ("added", "removed", "changed")}
    print(", ".join(f"{n} {kind}" for kind, n in counts.items()) + f" from {args.left} to {args.right}")
    return 0


def run_install_hooks(args: argparse.Namespace) -> int:
    from flows import publish_guard

    repo = _open(args)
    repo.ensure()
    commit = publish_guard.install(repo)
    paths = sorted(publish_guard.guard_files())
    if args.json:
        _print_json({"commit": commit, "branch": publish_guard.GUARDED_BRANCH, "paths": paths})
    elif commit is None:
        print(f"{publish_guard.GUARDED_BRANCH} already holds the publish guard: {', '.join(paths)}")
    else:
        print(
            f"installed the publish guard on {publish_guard.GUARDED_BRANCH} at commit {commit}: {', '.join(paths)}"
        )
        print("merges into main now pass only when every stage gate is recorded as passed (tokenlake curate)")
    return 0


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns: numbers right-aligned, text left-aligned; the last column unpadded."""
    cells = [[str(h) for h in headers]] + [[str(v) for v in row] for row in rows]
    numeric = [bool(rows) and all(isinstance(row[i], int) for row in rows) for i in range(len(headers))]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    lines = []
    for line in cells:
        padded = [
            cell if i == len(line) - 1 else cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _open(args: argparse.Namespace) -> DataRepo:
    from versioning import open_repo

    return open_repo(args.repo, create=False)


def _print_refs(args: argparse.Namespace, refs: dict[str, str], kind: str) -> int:
    if args.json:
        _print_json(refs)
    elif refs:
        print(format_table((kind, "commit"), [(name, cid) for name, cid in refs.items()]))
    else:
        print(f"no {kind}s")
    return 0


def _commit_json(commit: Commit) -> dict[str, object]:
    return {**asdict(commit), "parents": list(commit.parents), "created_utc": _when(commit.created)}


def _metadata_text(commit: Commit) -> str:
    """The metadata a reader scans for: the stage, its counts, its gate, a published tag."""
    meta = commit.metadata
    parts = [meta["stage"]] if meta.get("stage") else []
    # a stage that reads no documents (mix) records 0 of 0: not a count worth showing
    if (
        "documents_in" in meta
        and "kept" in meta
        and (meta["documents_in"], meta.get("rejected", "0")) != ("0", "0")
    ):
        parts.append(f"kept {meta['kept']} of {meta['documents_in']}")
    if meta.get("tokens", "0") not in ("", "0"):
        parts.append(f"{meta['tokens']} tokens")
    if meta.get("gate"):
        parts.append(f"gate {meta['gate']}")
    if meta.get("tag"):
        parts.append(f"tag {meta['tag']}")
    return ", ".join(parts)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value
