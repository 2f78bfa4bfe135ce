"""The ``tokenlake`` command line: ``tokenlake --help`` lists the commands."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module registers its sub-commands; the order is the order of ``--help``.
COMMAND_MODULES = [
    "flows.commands.run",
    "flows.commands.curate",
    "flows.commands.train",
    "flows.commands.repo",
    "flows.commands.shards",
    "flows.commands.lineage",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenlake",
        description="Versioned token datasets and training bound to the data commit.",
    )
    parser.add_argument(
        "--repo",
        default=None,
        help="dataset repository: a local directory or lakefs://<repository> "
        "(default: $TOKENLAKE_REPO, else $TOKENLAKE_HOME/repo)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a user-facing CLI prints one sentence, not a traceback
        from versioning import RepoError

        if isinstance(exc, RepoError | ValueError | FileNotFoundError):
            print(f"tokenlake: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
