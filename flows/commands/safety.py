"""``tokenlake decontaminate``: a published version against a new benchmark set.

It is a curate run whose config differs from the version's in ``[safety.decontamination]``
only: ingest, validate and dedup are reused in place from the version (checked before the run
starts, see :func:`flows.stage_runner.check_reuses_version`), and safety -> shard -> mix run
and publish a new version that records the new sets under ``eval_sets/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    command = subparsers.add_parser(
        "decontaminate",
        help="decontaminate the newest published version against a benchmark set and publish the result",
        description="Run the safety stage alone on a published version, with the benchmark sets of "
        "--benchmarks, reusing its ingest, validate and dedup outputs, and publish a new version "
        "(safety, shard and mix run again).",
    )
    command.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="the curate TOML the version was made with"
    )
    command.add_argument(
        "--benchmarks",
        required=True,
        type=Path,
        metavar="FILE",
        help="TOML of the [safety.decontamination] table: [[benchmarks]] (name, path, fields, id_field), "
        "and optionally ngram and mode; paths relative to this file",
    )
    command.add_argument(
        "--version", metavar="TAG", help="the published version to start from (default: main's newest)"
    )
    command.add_argument("--json", action="store_true", help="print the result as JSON")
    command.set_defaults(handler=run_decontaminate)


def load_benchmarks(path: Path) -> dict:
    """The decontamination table of ``path``, its file paths made relative to it."""
    from flows.params import read_toml

    data = read_toml(path, "benchmarks file")
    base = path.resolve().parent
    for benchmark in data.get("benchmarks", []):
        if isinstance(benchmark, dict) and isinstance(benchmark.get("path"), str):
            benchmark["path"] = str(base / Path(benchmark["path"]).expanduser())
    return data


def run_decontaminate(args: argparse.Namespace) -> int:
    from flows.commands.curate import curate_and_report
    from flows.params import CurateParams
    from flows.stage_runner import check_reuses_version
    from versioning import default_repo_spec

    params = CurateParams.from_toml(args.config)
    if args.repo:
        params.repository.spec = args.repo
    data = params.model_dump()
    data["safety"]["decontamination"] = load_benchmarks(args.benchmarks)
    params = CurateParams.from_dict(data, where=str(args.benchmarks))
    record = check_reuses_version(params, params.repository.spec or default_repo_spec(), args.version)
    if not args.json:
        print(f"decontaminating {record.tag}: ingest, validate and dedup are reused from it")
    curate_and_report(params, as_json=args.json)
    return 0
