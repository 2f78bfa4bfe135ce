"""``tokenlake shards verify REF [--json]``: re-read every shard of a dataset version and check it.

Prints one row per checked object (manifest, tokenizer, each shard) and exits 1 when any
has a fault (a truncated or bit-flipped shard is named in its row), 0 when all are sound.
"""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

TABLE_COLUMNS = ("name", "sequences", "documents", "bytes", "status")  # documents: ending in the shard


def register(subparsers: argparse._SubParsersAction) -> None:
    shards = subparsers.add_parser("shards", help="inspect and verify the token shards of a dataset version")
    commands = shards.add_subparsers(dest="shards_command", metavar="SUBCOMMAND", required=True)
    verify = commands.add_parser(
        "verify",
        help="re-read every shard at REF: header, size, sha256, end-of-document placement",
        description="Re-read every shard at REF and check header, size, sha256 and end-of-document "
        "placement against shards/manifest.json. Exits 1 on any fault.",
    )
    verify.add_argument("ref", metavar="REF", help="a branch, tag or commit id")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from tasks.shard.verify import verify_shards_at
    from versioning import open_repo

    repo = open_repo(args.repo)
    with tqdm(desc="verifying shards", unit="shard", file=sys.stderr, disable=None) as bar:

        def advance(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        result = verify_shards_at(repo, args.ref, on_shard=advance)
    rows = result.rows()
    if args.json:
        print(
            json.dumps(
                {"ref": result.ref, "commit_id": result.commit_id, "ok": result.ok, "checks": rows}, indent=2
            )
        )
    else:
        print(format_table(rows))
        shards = [r for r in rows if r["source"]]
        if result.ok:
            sequences = sum(int(r["sequences"]) for r in shards)
            documents = sum(int(r["documents"]) for r in shards)
            print(
                f"OK: {len(shards)} shards, {sequences} sequences verified at {args.ref} ({result.commit_id[:12]}); "
                f"{documents} documents end in them (`tokenlake datasets`: in shards)"
            )
        else:
            names = ", ".join(c.name for c in result.faulty)
            print(f"FAULT: {len(result.faulty)} of {len(rows)} objects at {args.ref} have faults: {names}")
    return 0 if result.ok else 1


def format_table(rows: list[dict[str, object]]) -> str:
    cells = [list(TABLE_COLUMNS)] + [[str(row[c]) for c in TABLE_COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_COLUMNS) - 1)]
    lines = []
    for line in cells:
        padded = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        lines.append("  ".join([*padded, line[-1]]))
    return "\n".join(lines)
