"""The README cannot drift from the CLI: every command in one of its ```bash blocks runs.

A command that runs long or needs a published dataset runs with ``--help`` instead (that
still fails on a renamed command or option); the others run as written, from the project
root, with `.venv/bin` on PATH (as after `source .venv/bin/activate`) and a fresh data home
holding a small repository. Every ``--option`` the README's command table shows must be in
that command's ``--help``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# (program, first words) -> run with --help: long-running, or needing a published dataset
HELP_ONLY = {
    ("./dev", "run"), ("./dev", "test"), ("./dev", "services"), ("./dev", "lakefs"), ("./dev", "stack"),
    ("tokenlake", "run"), ("tokenlake", "curate"), ("tokenlake", "train"), ("tokenlake", "serve"),
    ("tokenlake", "rollback"), ("tokenlake", "lineage"), ("tokenlake", "shards"), ("tokenlake", "export"),
    ("prefect", "server"),
}  # fmt: skip


def readme_commands() -> list[str]:
    """Each command line of the README's ```bash blocks (comments and continuations joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def as_run(command: str) -> str:
    """The command as the test runs it: ``--help`` appended where it is in HELP_ONLY."""
    words = shlex.split(command)
    env = [w for w in words if re.match(r"^[A-Z_]+=", w)]
    program, *rest = words[len(env) :]
    name = Path(program).name if program.startswith(".venv/") else program
    if (name, rest[0] if rest else "") in HELP_ONLY:
        subcommand = rest[:1] if name != "prefect" else rest[:2]
        return " ".join([*env, program, *subcommand, "--help"])
    return command


def test_the_readme_shows_commands():
    commands = readme_commands()
    assert any(c.startswith("./dev run") for c in commands) and any("tokenlake serve" in c for c in commands)
    assert (
        as_run("PREFECT_API_URL=http://x/api tokenlake serve")
        == "PREFECT_API_URL=http://x/api tokenlake serve --help"
    )
    assert as_run("tokenlake datasets") == "tokenlake datasets"


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_runs(command: str, tmp_path: Path):
    from versioning.local import LocalRepo

    home = tmp_path / "home"
    repo = LocalRepo(home / "repo")
    repo.ensure()
    repo.put("main", "reports/ingest.json", b"{}")
    repo.commit("main", "ingest", {"stage": "ingest", "documents_in": "3", "kept": "2", "gate": "passed"})
    env = os.environ | {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "TOKENLAKE_HOME": str(home),
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    env.pop("TOKENLAKE_REPO", None)
    done = subprocess.run(["bash", "-c", as_run(command)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{as_run(command)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def _table_commands() -> list[str]:
    """The `tokenlake ...` cells of the README's command table."""
    return re.findall(r"^\| `(tokenlake [^`]+)` \|", README.read_text(), re.MULTILINE)


def _help(*argv: str) -> str:
    """``tokenlake ARGV --help``'s text ("" when ARGV is not a command)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def test_every_option_in_the_command_table_exists():
    commands = _table_commands()
    assert len(commands) >= 10
    for cell in commands:
        words = cell.split()
        subcommand = words[1]
        helps = [_help(subcommand)]
        assert helps[0], f"README names `tokenlake {subcommand}`, which does not exist"
        for word in re.split(r"[ |\\]+", " ".join(words[2:])):
            if re.fullmatch(r"[a-z][a-z0-9-]+", word):
                helps.append(_help(subcommand, word))  # a sub-subcommand (repo log, shards verify, ...)
        for option in re.findall(r"--[a-z][a-z-]*", cell):
            assert any(option in text for text in helps), (
                f"`{cell}`: {option} is not an option of tokenlake {subcommand}"
            )
