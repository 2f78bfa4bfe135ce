"""Curate commands: ``curate --config FILE``, ``datasets``, ``janitor``, ``serve``.

Prefect is imported inside the handlers, after ``flows.cli.prefect_environment`` has set
the project's defaults (telemetry off, state inside the project), because Prefect reads its
settings when it is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PREFECT_YAML = PROJECT_ROOT / "deploy" / "prefect.yaml"


def register(subparsers: argparse._SubParsersAction) -> None:
    from flows.served_workers import STOP_TIMEOUT_S

    curate = subparsers.add_parser(
        "curate",
        help="run the curate flow: ingest, validate, dedup, shard, mix, publish",
        description="Run the curate flow on the sources of a TOML config (see examples/curate.toml); "
        "publishes a tagged dataset version on main when every gate passes.",
    )
    curate.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="TOML file of CurateParams"
    )
    curate.add_argument("--json", action="store_true", help="print the result as JSON")
    curate.add_argument(
        "--runner",
        metavar="local|dask[:ADDRESS]",
        help="where partitions run: local, dask (a LocalCluster), dask:tcp://host:8786 (an existing scheduler)",
    )
    curate.add_argument("--workers", type=int, metavar="N", help="local processes, or LocalCluster workers")
    curate.add_argument(
        "--dashboard",
        metavar="ADDRESS",
        help="with --runner dask: serve the Dask dashboard there (e.g. :8787; needs bokeh)",
    )
    curate.set_defaults(handler=run_curate)

    datasets = subparsers.add_parser("datasets", help="list published dataset versions")
    datasets.add_argument("--json", action="store_true", help="print the list as JSON")
    datasets.set_defaults(handler=run_datasets)

    janitor = subparsers.add_parser(
        "janitor",
        help="remove run branches left by killed curate runs, and scratch left by killed processes",
        description="Remove curate-* branches whose flow run is dead and ended at least MAX_AGE ago "
        "(never a live run's), a publish lock held by a dead process, and the loader rings and dedup "
        "spill folders that dead processes of this host left.",
    )
    janitor.add_argument("--max-age", default="24h", help="e.g. 36h, 90m, 2d, 0 (default: 24h)")
    janitor.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    janitor.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    janitor.set_defaults(handler=run_janitor)

    serve = subparsers.add_parser(
        "serve",
        help="register deploy/prefect.yaml's deployments and run a worker for their work pool",
        description="Register every deployment of a prefect.yaml (curate nightly, janitor, train) with "
        "`prefect deploy`, creating its process work pool if missing, and run a Prefect worker for that pool "
        "in this process: runs come from their schedules or from the Prefect UI. Needs a Prefect server "
        "(PREFECT_API_URL).",
    )
    serve.add_argument("--prefect-yaml", type=Path, default=DEFAULT_PREFECT_YAML, metavar="FILE")
    serve.add_argument(
        "--stop-timeout",
        type=seconds,
        default=STOP_TIMEOUT_S,
        metavar="S",
        help="at SIGTERM or Ctrl-C, the seconds runs in flight get to finish before they are ended and "
        "marked Crashed (default %(default)g; a second signal ends them at once)",
    )
    serve.set_defaults(handler=run_serve)


def seconds(text: str) -> float:
    """An argparse type: 0 or more seconds, refused before anything starts."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def run_curate(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from flows.params import CurateParams, RunnerConfig, one_sentence

    params = CurateParams.from_toml(args.config)
    if args.repo:
        params.repository.spec = args.repo
    if args.runner or args.workers or args.dashboard:
        runner = params.runner.model_dump() | {"spec": args.runner or params.runner.spec}
        try:
            params.runner = RunnerConfig.model_validate(
                runner
                | ({"workers": args.workers} if args.workers else {})
                | ({"dashboard": args.dashboard} if args.dashboard else {})
            )
        except ValidationError as exc:
            raise ValueError(f"--runner/--workers/--dashboard: {one_sentence(exc)}") from None
    curate_and_report(params, as_json=args.json)
    return 0


def curate_and_report(params: Any, as_json: bool) -> Any:
    """Run the curate flow with a console progress bar; print and return the version it made."""
    from flows.curate import curate

    version, rows = run_with_progress(params, curate, as_json)
    print_version(version, rows, as_json)
    return version


def run_with_progress(params: Any, flow: Any, as_json: bool) -> tuple[Any, list[dict[str, Any]]]:
    """``flow(params)`` (curate, or a flow that curates first) under a progress bar over the
    curate stages; returns its result and one row per stage.

    What can be checked without Prefect is checked first (a misconfiguration or a ref that
    does not exist is one sentence, and no run). A run that fails ends in
    :class:`flows.cli.CommandFailed`: the paragraph the run also logs (:mod:`flows.failed_run`).
    """
    from flows.artifacts import stage_row
    from flows.commands.refs import resolve_ref
    from flows.failed_run import failure_report, main_head, repository_state
    from flows.params import check_ready
    from versioning import default_repo_spec

    spec = params.repository.spec or default_repo_spec()
    check_ready(params, spec)
    if params.shards.reuse_tokenizer_from:
        resolve_ref(spec, params.shards.reuse_tokenizer_from, "shards.reuse_tokenizer_from")
    main_before = main_head(spec)

    events: list[Any] = []
    try:
        with console_progress(events, enabled=not as_json):
            result = flow(params)
    except Exception as exc:
        from flows.cli import CommandFailed

        branch = next((e.branch for e in events if e.branch), None)
        raise CommandFailed(failure_report(exc, repository_state(spec, main_before, branch))) from exc
    return result, [stage_row(e.run) for e in events if e.run is not None]


def print_version(
    version: Any, rows: list[dict[str, Any]], as_json: bool, extra: dict[str, Any] | None = None
) -> None:
    if as_json:
        print(json.dumps({**asdict(version), "stages": rows, **(extra or {})}, indent=2))
    else:
        print(format_table([_compact(row) for row in rows]))
        print(f"\n{version}")


CONSOLE_COLUMNS = (
    "stage",
    "documents in",
    "kept",
    "quarantined",
    "quarantined by reason",
    "produced",
    "seconds",
    "ran",
)


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    """A console row: the three most frequent quarantine reasons; tokens are in 'produced', the
    full commit ids in --json and the Prefect artifacts."""
    from flows.artifacts import top_reasons

    reasons = [r.rsplit(": ", 1) for r in (row["quarantined by reason"] or "").split(", ") if ": " in r]
    if row["quarantined by reason"] is not None:
        row = row | {"quarantined by reason": top_reasons({reason: int(n) for reason, n in reasons})}
    return {column: row[column] for column in CONSOLE_COLUMNS}


@contextmanager
def console_progress(events: list[Any], enabled: bool = True) -> Iterator[None]:
    """A progress bar over the stages, fed by the flow's stage events."""
    from tqdm import tqdm

    from flows.artifacts import listening

    with tqdm(total=5, desc="curate", unit="stage", file=sys.stderr, disable=not enabled or None) as bar:

        def on_event(event: Any) -> None:
            events.append(event)
            bar.total = event.total
            if event.result is None:
                bar.set_description(f"curate: {event.stage}")
            else:
                bar.set_postfix_str(f"{event.stage} {'reused' if event.reused else 'done'}")
                bar.update(1)

        with listening(on_event):
            yield


def run_datasets(args: argparse.Namespace) -> int:
    from flows.wap import list_versions
    from versioning import open_repo

    versions = list_versions(open_repo(args.repo))
    if args.json:
        print(json.dumps([asdict(v) for v in versions], indent=2))
        return 0
    if not versions:
        print("no published dataset versions yet: run `tokenlake run` or `tokenlake curate --config FILE`")
        return 0
    rows = []
    for v in versions:
        sources = sorted(set(v.documents) | set(v.tokens)) or ["none"]
        for i, source in enumerate(sources):
            first = i == 0
            rows.append(
                {
                    "tag": v.tag if first else "",
                    "commit": v.commit_id[:12] if first else "",
                    "date": v.created if first else "",
                    "source": source,
                    "documents": v.documents.get(source, ""),
                    "in shards": v.documents_in_shards.get(source, ""),
                    "tokens in shards": v.tokens.get(source, ""),
                }
            )
    print(format_table(rows))
    print("documents: after dedup; in shards: documents that end in a stored sequence (as `shards verify` "
          "counts them: a source's tokens after its last whole sequence are not stored)")  # fmt: skip
    return 0


def run_janitor(args: argparse.Namespace) -> int:
    from flows.janitor import parse_age, sweep, sweep_scratch
    from versioning import open_repo

    verdicts = sweep(open_repo(args.repo, create=False), parse_age(args.max_age), args.dry_run)
    scratch = sweep_scratch(args.dry_run)
    if args.json:
        print(
            json.dumps(
                {"branches": [asdict(v) for v in verdicts], "scratch": [asdict(v) for v in scratch]}, indent=2
            )
        )
        return 0
    print(format_table([asdict(v) for v in verdicts]) if verdicts else "no run branches: nothing to clean")
    if scratch:
        print(
            f"\nscratch left by dead processes on this host ({'kept: --dry-run' if args.dry_run else 'removed'}):"
        )
        print(format_table([asdict(v) for v in scratch]))
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from flows.deployments import deploy_all, start_worker

    pools = deploy_all(args.prefect_yaml, PROJECT_ROOT)
    print(f"tokenlake serve: registered the deployments of {args.prefect_yaml}; worker for pool(s) "
          f"{', '.join(pools)} starting (Ctrl-C or SIGTERM stops it within --stop-timeout + 10 s)", file=sys.stderr)  # fmt: skip
    return start_worker(pools, PROJECT_ROOT, args.stop_timeout)


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    cells = [[str(c) for c in columns]] + [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
