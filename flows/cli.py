"""The ``tokenlake`` command line: ``tokenlake --help`` lists the commands.

A user error or an expected failure (a gate that did not hold, a ref that does not exist, a
value out of range) ends the command with sentences and a non-zero status: 2 for what the
user must change, 1 for a run that failed. ``--debug`` (or ``TOKENLAKE_DEBUG=1``) shows the
traceback instead, and Prefect's own console log.
"""

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
    "flows.commands.safety",
    "flows.commands.train",
    "flows.commands.repo",
    "flows.commands.shards",
    "flows.commands.lineage",
    "flows.commands.export",
    "flows.commands.deploy",
]
SERVICE_COMMANDS = {"serve"}  # long-running: their console is a service log, at INFO


class CommandFailed(RuntimeError):
    """A run failed the way runs can fail (a gate, training): the message is the whole report."""

    exit_code = 1


def prefect_environment(debug: bool = False, service: bool = False) -> None:
    """Telemetry off, Prefect's state in the project, and logging that fits the command, unless
    the user chose otherwise. Set before any command imports Prefect, which reads its settings
    at import time.

    Flow and task runs log at INFO to the Prefect API (the UI's Logs tab), whatever the
    console shows. An interactive command's console shows its own progress and sentences,
    so Prefect's console handler only passes CRITICAL there; ``--debug`` and services
    (``tokenlake serve``) show Prefect's log at INFO.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(Path(__file__).resolve().parents[1] / ".prefect"))
    if not debug and not service:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    # The ephemeral API's first start migrates its database: slow on a small, busy machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Parser(argparse.ArgumentParser):
    """argparse, with its error as one sentence (and where to look) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tokenlake",
        description="Versioned token datasets and training bound to the data commit.",
    )
    parser.add_argument(
        "--repo",
        default=None,
        help="dataset repository: a local directory or lakefs://REPOSITORY "
        "(default: $TOKENLAKE_REPO, else $TOKENLAKE_HOME/repo)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks and Prefect's console log (also: TOKENLAKE_DEBUG=1)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def explain(exc: BaseException) -> tuple[int, str]:
    """(exit status, the sentences a user reads) for an exception that ended a command."""
    from pydantic import ValidationError

    from flows.commands.values import one_sentence
    from flows.refusals import is_refusal
    from versioning import RepoError

    if isinstance(exc, CommandFailed):
        return exc.exit_code, str(exc)
    if is_refusal(exc):  # a run refused on purpose: its message says what to change
        return 2, str(exc)
    if isinstance(exc, ValidationError):
        return 2, one_sentence(exc)
    if isinstance(exc, RepoError | ValueError | FileNotFoundError):
        return 2, str(exc)
    return 1, f"{type(exc).__name__}: {exc} (unexpected; `tokenlake --debug ...` shows the traceback)"


def show_notice(level: int, message: str) -> None:
    """A run's notice on the console, above a progress bar if one is drawn."""
    from tqdm import tqdm

    said = "warning: " if level >= logging.WARNING else ""
    tqdm.write(f"tokenlake: {said}{message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("TOKENLAKE_DEBUG") == "1"
    service = args.command in SERVICE_COMMANDS
    prefect_environment(debug=debug, service=service)
    try:
        if debug or service:  # Prefect's console log shows the runs' notices
            return int(args.handler(args) or 0)
        from flows.notices import to_console

        with to_console(show_notice):
            return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a user-facing CLI prints sentences, not a traceback
        if debug:
            raise
        code, text = explain(exc)
        print(f"tokenlake: error: {text}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
