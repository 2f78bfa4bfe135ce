"""The ``tokenlake`` command line: ``tokenlake --help`` lists the commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

# Each module registers its sub-commands; the order is the order of ``--help``.
COMMAND_MODULES = [
    "flows.commands.run",
    "flows.commands.curate",
    "flows.commands.train",
    "flows.commands.repo",
    "flows.commands.shards",
    "flows.commands.lineage",
    "flows.commands.deploy",
]


def prefect_environment() -> None:
    """Telemetry off and Prefect's state in the project, unless the user chose otherwise.

    Set before any command imports Prefect, which reads its settings at import time.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(Path(__file__).resolve().parents[1] / ".prefect"))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the console shows progress instead
    # The ephemeral API's first start migrates its database: slow on a small, busy machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # GX announces every ephemeral docs site at INFO; the stage tables already say what ran
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


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
    prefect_environment()
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
