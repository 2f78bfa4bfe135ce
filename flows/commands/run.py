"""``tokenlake run``: the demo. Curates real sources this machine has into a dataset version,
then trains a tiny GPT on the commit it published (:mod:`flows.pipeline`).

No arguments needed on a fresh machine: a local repository under the data home
(``$TOKENLAKE_HOME``, else ``./.tokenlake``), an ephemeral Prefect API whose history is kept
in ``.prefect/`` (``prefect server start`` shows it afterwards), and the Python standard
library, installed packages' metadata and license files as sources (``flows.demo_sources``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from flows.commands.curate import print_version, run_with_progress
from flows.commands.values import positive_number, whole_number
from flows.defaults import DEFAULT_STEPS


def command(name: str) -> str:
    """How to type ``name`` (tokenlake, prefect) so that it works as printed: the bare name when
    the shell finds this environment's copy, else its path (relative to here when inside it)."""
    installed = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and Path(found).resolve() == installed.resolve():
        return name
    try:
        return str(installed.relative_to(Path.cwd()))
    except ValueError:
        return str(installed)


def where_to_look(tag: str, repo: str, prefect_home: str, funnel: Path | None = None) -> str:
    tokenlake, prefect = command("tokenlake"), command("prefect")
    rows = [
        (f"{tokenlake} datasets", "published versions: tag, commit, documents and tokens per source"),
        (f"{tokenlake} shards verify {tag}", "re-read and check every shard of this version"),
        (f"{tokenlake} lineage {tag}", "the checkpoints trained on this version"),
        ("repository", repo),
    ]
    if funnel is not None and funnel.is_file():
        rows.append(("funnel", f"{funnel} (documents and tokens per source through the stages)"))
    rows += [
        ("Prefect UI", f"PREFECT_HOME={prefect_home} {prefect} server start, then http://127.0.0.1:4200"),
        ("", "(the flow runs and their logs, each stage's table, the run summary with Data Docs links)"),
    ]
    if tokenlake != "tokenlake":
        rows.append(("", f"(`source {Path(tokenlake).parent}/activate` puts tokenlake and prefect on PATH)"))
    width = max(len(left) for left, _ in rows) + 3
    return "\nWhere to look:\n" + "\n".join(f"  {left.ljust(width)}{right}" for left, right in rows)


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run",
        help="the demo: curate this machine's Python sources and package docs, then train on them",
        description="Curate real sources this machine has (the Python standard library as code, installed "
        "packages' metadata and license files as prose) into a published dataset version, then train a "
        "tiny GPT on that exact commit, with embedded defaults: a local repository and an ephemeral "
        "Prefect API.",
    )
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument(
        "--code-mb", type=positive_number, default=6.0, help="standard-library code to sample (default 6 MB)"
    )
    run.add_argument(
        "--prose-mb", type=positive_number, default=4.0, help="package docs and licenses (default 4 MB)"
    )
    run.add_argument(
        "--steps", type=whole_number(0, " (0: curate only)"), default=DEFAULT_STEPS,
        help=f"training steps (default {DEFAULT_STEPS}; 0: curate only)",
    )  # fmt: skip
    run.add_argument("--nproc", type=whole_number(1), default=1, help="training processes (default 1)")
    run.set_defaults(handler=run_demo)


def demo_params(repo: str | None, code_mb: float = 6.0, prose_mb: float = 4.0) -> Any:
    from flows.demo_sources import MB, DemoBudget, demo_sources
    from flows.params import CurateParams, GateConfig, RepositoryConfig
    from tasks.ingest.config import IngestConfig
    from versioning import data_home

    budget = DemoBudget(
        code_bytes=int(code_mb * MB),
        prose_bytes=int(prose_mb * MB * 2 / 3),
        license_bytes=int(prose_mb * MB / 3),
    )
    return CurateParams(
        ingest=IngestConfig(sources=demo_sources(data_home() / "demo-sources", budget)),
        gates=GateConfig(min_documents=100, min_tokens=100_000, max_quarantined_fraction=0.9),
        repository=RepositoryConfig(spec=repo),
    )


def run_demo(args: argparse.Namespace) -> int:
    from flows.commands.refs import repo_spec_label
    from flows.commands.train import print_training
    from flows.curate import curate
    from flows.funnel import funnel_path
    from flows.pipeline import PipelineParams, pipeline
    from flows.train import TrainParams
    from versioning import default_repo_spec

    params = demo_params(args.repo, args.code_mb, args.prose_mb)
    spec = params.repository.spec or default_repo_spec()
    if args.steps <= 0:
        version, rows = run_with_progress(params, curate, args.json)
        print_version(version, rows, args.json)
        training = None
    else:
        train = TrainParams(preset="tiny", steps=args.steps, nproc=args.nproc, repo=spec)
        result, rows = run_with_progress(
            params, lambda p: pipeline(PipelineParams(curate=p, train=train)), args.json
        )
        version, training = result.published, result.training
        extra = {"training": training.model_dump(mode="json")}
        print_version(version, rows, args.json, extra)
    if not args.json:
        if training is not None:
            print()
            print_training(training)
        print(
            where_to_look(
                version.tag, repo_spec_label(spec), os.environ["PREFECT_HOME"], funnel_path(version.tag)
            )
        )
    return 0
