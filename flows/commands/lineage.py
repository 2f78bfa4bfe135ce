"""``tokenlake lineage REF`` and ``tokenlake rollback --to REF``.

    tokenlake lineage RUN@STEP | CHECKPOINT_DIR [--step N]   data version, publish, stages, sources
                                                             (--step: the samples that step read)
    tokenlake lineage TAG | COMMIT | BRANCH                   every checkpoint trained on that commit
    tokenlake rollback --to REF [--hard] [--resume]           restore main, taint, optionally resume

Both take ``--json``. The rollback is checked (target, publish lock) before Prefect starts,
so a refused rollback answers at once; the flow itself checks again under the lock.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.commands.curate import format_table
from flows.commands.values import whole_number

SHORT = 12


def register(subparsers: argparse._SubParsersAction) -> None:
    lineage = subparsers.add_parser(
        "lineage",
        help="what a checkpoint was trained on, or which checkpoints a data version trained",
        description="From a checkpoint (RUN@STEP or its directory): its data commit, the publish merge and "
        "tag, each stage's commit with config hash and flow run, the sources, and with --step N the samples "
        "(position, source, shard, sequence) that step read. From a tag, commit or branch: every checkpoint "
        "of every run trained on that commit, with step, metrics and taint marks.",
    )
    lineage.add_argument(
        "ref", metavar="REF", help="RUN@STEP, a checkpoint directory, a tag, a commit id or a branch"
    )
    lineage.add_argument(
        "--step", type=whole_number(0), metavar="N", help="list the samples training step N read"
    )
    lineage.add_argument("--json", action="store_true", help="print JSON")
    lineage.set_defaults(handler=run_lineage)

    rollback = subparsers.add_parser(
        "rollback",
        help="restore main to an earlier dataset version; taint checkpoints trained on what left it",
        description="Restore main's content to REF with new revert commits (history kept), tag the rollback, "
        "mark every checkpoint trained on data no longer on main as tainted (never deleted), and with "
        "--resume continue each such run from its newest untainted checkpoint on the restored main.",
    )
    rollback.add_argument(
        "--to", required=True, metavar="REF", help="a ds-* tag or commit id on main's history"
    )
    rollback.add_argument(
        "--hard", action="store_true", help="move main to REF instead (later history leaves main)"
    )
    rollback.add_argument("--resume", action="store_true", help="resume tainted runs on the restored main")
    rollback.add_argument(
        "--resume-steps", type=whole_number(1), metavar="N", help="steps the resumed runs train to"
    )
    rollback.add_argument("--json", action="store_true", help="print the report as JSON")
    rollback.set_defaults(handler=run_rollback)


def is_checkpoint_ref(ref: str) -> bool:
    from flows.lineage import CHECKPOINT_REF

    return bool(CHECKPOINT_REF.match(ref)) or (Path(ref) / "meta.json").is_file()


def run_lineage(args: argparse.Namespace) -> int:
    from versioning import open_repo

    repo = open_repo(args.repo, create=False)
    if is_checkpoint_ref(args.ref):
        return _checkpoint_lineage(repo, args)
    if args.step is not None:
        raise ValueError("--step needs a checkpoint (RUN@STEP or its directory), not a data version")
    return _data_lineage(repo, args)


def _checkpoint_lineage(repo: Any, args: argparse.Namespace) -> int:
    from flows.lineage import checkpoint_lineage
    from flows.step_samples import step_positions

    found = checkpoint_lineage(repo, args.ref)
    positions = step_positions(repo, found.checkpoint, args.step) if args.step is not None else None
    if args.json:
        body = {
            "checkpoint": found.checkpoint.summary(),
            "data": asdict(found.data),
            "events": list(found.events),
        }
        if positions is not None:
            body["step"] = {"step": args.step, "samples": [asdict(p) for p in positions]}
        print(json.dumps(body, indent=2, default=str))
        return 0
    checkpoint, data = found.checkpoint, found.data
    print(f"checkpoint   {checkpoint.name}: step {checkpoint.step}, {checkpoint.tokens} tokens, "
          f"{_metrics(checkpoint.metrics)}")  # fmt: skip
    print(f"path         {checkpoint.checkpoint}")
    if checkpoint.reverted is not None:
        unmarked = "" if checkpoint.marked else " (no mark yet: `tokenlake rollback --to main` adds it)"
        print(f"TAINTED      by {checkpoint.reverted.rollback}: {checkpoint.reverted.reason}{unmarked}")
    for mark in checkpoint.taints:
        if checkpoint.reverted is None or mark.rollback != checkpoint.reverted.rollback:
            good = "" if checkpoint.tainted else "; its data is good again (restored or re-published since)"
            print(f"marked       by {mark.rollback}: {mark.reason}{good}")
    print(_data_header(data))
    if data.stages:
        print()
        print(format_table([
            {"stage": s.stage, "commit": s.commit[:SHORT], "config hash": s.config_hash, "flow run": s.flow_run_id}
            for s in data.stages
        ]))  # fmt: skip
    if data.sources:
        print()
        print(format_table([{k: _cell(v) for k, v in source.items()} for source in data.sources]))
    if found.events:
        print()
        print(
            format_table(
                [{"event": e["kind"], "step": e["step"], "detail": _event_detail(e)} for e in found.events]
            )
        )
    if positions is not None:
        print(f"\nstep {args.step} read {len(positions)} samples:")
        print(format_table([asdict(p) for p in positions]))
    return 0


def _data_lineage(repo: Any, args: argparse.Namespace) -> int:
    from flows.lineage import checkpoints_on, describe_data, read_lineage

    index = read_lineage(repo)
    data = describe_data(repo, args.ref, index)
    checkpoints = checkpoints_on(repo, data.commit, index)
    if args.json:
        print(json.dumps({"data": asdict(data), "checkpoints": [c.summary() for c in checkpoints]}, indent=2))
        return 0
    print(_data_header(data))
    if not checkpoints:
        print(f"\nno checkpoint was trained on {args.ref}")
        return 0
    print()
    print(format_table([
        {"checkpoint": c.name, "step": c.step, "tokens": c.tokens, "loss": _number(c.metrics.get("loss")),
         "eval_loss": _number(c.metrics.get("eval_loss")), "saved": _when(c.saved_at),
         "tainted": _taint_cell(c), "path": c.checkpoint}
        for c in checkpoints
    ]))  # fmt: skip
    return 0


def _data_header(data: Any) -> str:
    lines = [f"data commit  {data.commit}  ({data.message})"]
    if data.tags:
        lines.append(f"tags         {', '.join(data.tags)}")
    if data.restores:
        lines.append(f"restores     {data.restores}")
    if data.publish_commit:
        lines.append(f"published    {data.publish_tag} by merge {data.publish_commit[:SHORT]} "
                     f"(curate flow run {data.publish_flow_run_id or 'unknown'})")  # fmt: skip
    else:
        lines.append("published    no: this commit holds no published dataset version")
    for tag in data.reverted_by:
        lines.append(f"REVERTED     by {tag}: not on main any more")
    return "\n".join(lines)


def run_rollback(args: argparse.Namespace) -> int:
    from flows.rollback import MARKS_ONLY, RollbackParams, rollback
    from flows.taint import plan_or_marks
    from versioning import default_repo_spec, open_repo

    params = RollbackParams(to=args.to, hard=args.hard, resume=args.resume, resume_steps=args.resume_steps,
                            repository=args.repo or default_repo_spec())  # fmt: skip
    plan_or_marks(
        open_repo(params.repository, create=False), params.to, params.hard
    )  # refuses before Prefect starts
    report = rollback(params)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return 0
    if report.method == MARKS_ONLY:
        print(f"main already holds {report.target_ref} ({report.target[:SHORT]}): nothing to roll back")
    else:
        print(f"rollback {report.tag}: main restored to {report.target_ref} ({report.target[:SHORT]}) "
              f"by {report.method}; main is {report.main[:SHORT]}")  # fmt: skip
    if report.reverted:
        print(f"reverted: {', '.join(c[:SHORT] for c in report.reverted)}")
    if report.tainted:
        print(f"\n{len(report.tainted)} checkpoint(s) tainted (marked in lineage, kept on disk):")
        print(format_table([
            {"checkpoint": t["checkpoint"], "tokens": t["tokens"], "loss": _number(t["metrics"].get("loss")),
             "data commit": t["data_commit"][:SHORT], "tainted by": t["tainted_by"], "path": t["path"]}
            for t in report.tainted
        ]))  # fmt: skip
    elif report.method != MARKS_ONLY:
        print("no checkpoint was trained on the data that left main")
    for run in report.resumed:
        print(
            f"resumed {run.run} from {run.from_checkpoint} on {run.data_commit[:SHORT]}: reached step {run.step}"
        )
    return 0


def _taint_cell(checkpoint: Any) -> str:
    """The rollback that reverted the checkpoint's data, and whether a mark names it yet."""
    if checkpoint.reverted is None:
        return ""
    return checkpoint.reverted.rollback + ("" if checkpoint.marked else " (not marked yet)")


def _metrics(metrics: dict[str, Any]) -> str:
    shown = [f"{k} {_number(v)}" for k, v in sorted(metrics.items()) if k != "step"]
    return ", ".join(shown) or "no metrics"


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "" if value is None else str(value)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds") if seconds else ""


def _cell(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _event_detail(event: dict[str, Any]) -> str:
    if event["kind"] == "fork":
        return f"forked from {event['from_run']}@{event['from_step']} after {event['rollback']}"
    if event["kind"] == "data-change":
        return f"data {event['from']['commit'][:SHORT]} -> {event['to']['commit'][:SHORT]} ({event.get('allowed_by', '')})"
    if event["kind"] == "reverted-data":
        return f"trained on data {event['data_commit'][:SHORT]} reverted by {event['rollback']} ({event['allowed_by']})"
    if event["kind"] == "rollback":
        return f"rolled back to step {event.get('to_step', '?')}: {event.get('reason', '')}"
    return json.dumps({k: v for k, v in event.items() if k not in ("run", "kind", "step")}, default=str)[:120]
