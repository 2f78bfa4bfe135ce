"""``tokenlake run``: the demo. Curates real sources this machine has into a dataset version.

No arguments needed on a fresh machine: a local repository under the data home
(``$TOKENLAKE_HOME``, else ``./.tokenlake``), an ephemeral Prefect API whose history is kept
in ``.prefect/`` (``prefect server start`` shows it afterwards), and the Python standard
library, installed packages' metadata and license files as sources (``flows.demo_sources``).
"""

from __future__ import annotations

import argparse
from typing import Any

from flows.commands.curate import curate_and_report, prefect_environment


def where_to_look(tag: str, repo: str, prefect_home: str) -> str:
    rows = [
        ("tokenlake datasets", "published versions: tag, commit, documents and tokens per source"),
        (f"tokenlake shards verify {tag}", "re-read and check every shard of this version"),
        ("repository", repo),
        ("Prefect UI", f"PREFECT_HOME={prefect_home} prefect server start, then http://127.0.0.1:4200"),
        ("", "(the flow runs, each stage's table, the run summary with Data Docs links)"),
    ]
    width = max(len(left) for left, _ in rows) + 3
    return "\nWhere to look:\n" + "\n".join(f"  {left.ljust(width)}{right}" for left, right in rows)


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run",
        help="the demo: curate this machine's Python sources and package docs into a dataset version",
        description="Curate real sources this machine has (the Python standard library as code, installed "
        "packages' metadata and license files as prose) into a published dataset version, with "
        "embedded defaults: a local repository and an ephemeral Prefect API.",
    )
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--code-mb", type=float, default=6.0, help="standard-library code to sample (default 6 MB)")
    run.add_argument("--prose-mb", type=float, default=4.0, help="package docs and licenses (default 4 MB)")
    run.set_defaults(handler=run_demo)


def demo_params(repo: str | None, code_mb: float = 6.0, prose_mb: float = 4.0) -> Any:
    from flows.demo_sources import MB, DemoBudget, demo_sources
    from flows.params import CurateParams, GateConfig, RepositoryConfig
    from tasks.ingest.config import IngestConfig
    from versioning import data_home

    budget = DemoBudget(
        code_bytes=int(code_mb * MB), prose_bytes=int(prose_mb * MB * 2 / 3), license_bytes=int(prose_mb * MB / 3)
    )
    return CurateParams(
        ingest=IngestConfig(sources=demo_sources(data_home() / "demo-sources", budget)),
        gates=GateConfig(min_documents=100, min_tokens=100_000, max_quarantined_fraction=0.9),
        repository=RepositoryConfig(spec=repo),
    )


def run_demo(args: argparse.Namespace) -> int:
    prefect_environment()
    import os

    from flows.chain import repository_spec

    params = demo_params(args.repo, args.code_mb, args.prose_mb)
    version = curate_and_report(params, as_json=args.json)
    if not args.json:
        spec = repository_spec(params.repository.spec)
        print(where_to_look(version.tag, spec, os.environ["PREFECT_HOME"]))
    return 0
