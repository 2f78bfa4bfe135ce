"""The janitor: removes run branches (and a publish lock) left behind by dead curate runs.

A failed curate run deletes its own branch (the flow's on_failure/on_crashed hooks); only a
process that was killed leaves one behind. A branch ``curate-<flow run id>`` is removed when

* its flow run is not alive: in a final state, or Running/Pending while the process named
  in the run's ``infrastructure_pid`` (``host:pid``) is gone from this host. Such a run is
  marked Crashed in Prefect, so the UI shows what happened and offers a retry; and
* its flow run ended at least ``max_age_hours`` ago (kept that long for a look at what it wrote).

Never removed: a branch whose run is alive or scheduled, whose process runs on another host
(it cannot be checked from here), or whose run this Prefect API does not know. The
publish lock ``lock-publish`` is removed when its holder is dead or gone.

It also lists, and removes, the local scratch that SIGKILLed processes of this host left:
loader rings in ``/dev/shm``, dedup spill folders in the temp folder (named by their owner,
``versioning/scratch.py``; the next start of the same work removes them too).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed
from pydantic import BaseModel, ConfigDict, Field

from flows.wap import PUBLISH_LOCK_BRANCH, RUN_BRANCH_PREFIX, flow_run_of_branch, publish_in_progress
from tasks.stage_task import IO_RETRIES
from training.loader_ring import shm_dir
from versioning import DataRepo, NotFound, open_repo
from versioning.liveness import process_alive
from versioning.scratch import leftovers, remove

_LIVE_STATES = {StateType.RUNNING, StateType.PENDING, StateType.CANCELLING, StateType.PAUSED}
_WAITING_STATES = {StateType.SCHEDULED}  # includes AwaitingRetry: a retry will reuse the branch


class JanitorParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repository: str | None = Field(
        default=None, description="local directory or lakefs://REPOSITORY; default $TOKENLAKE_REPO"
    )
    max_age_hours: float = Field(
        default=24.0, ge=0, description="keep a dead run's branch this long after the run ended"
    )
    dry_run: bool = Field(default=False, description="report what would be removed, remove nothing")


@dataclass(frozen=True)
class Verdict:
    branch: str
    flow_run_id: str
    state: str
    age_hours: float | None
    removed: bool
    reason: str


@dataclass(frozen=True)
class ScratchVerdict:
    path: str
    kind: str
    pid: int
    bytes: int
    removed: bool


def sweep_scratch(dry_run: bool = False) -> list[ScratchVerdict]:
    """What dead processes of this host left in the scratch folders; removed unless ``dry_run``."""
    verdicts = []
    for directory in sorted({shm_dir(), Path(tempfile.gettempdir())}):
        for leftover in leftovers(directory):
            if not dry_run:
                remove(leftover)
            verdicts.append(
                ScratchVerdict(str(leftover.path), leftover.kind, leftover.pid, leftover.bytes, not dry_run)
            )
    return sorted(verdicts, key=lambda v: v.path)


def parse_age(text: str) -> float:
    """'36h', '90m', '2d', '0' or a number of hours -> hours."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"max age {text!r} is not a duration; write e.g. 36h, 90m, 2d or 0")
    value, unit = float(match.group(1)), match.group(2) or "h"
    return value * {"s": 1 / 3600, "m": 1 / 60, "h": 1, "d": 24}[unit]


def _read_flow_run(client: Any, flow_run_id: str) -> FlowRun | None:
    try:
        return client.read_flow_run(UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return None


def _judge_run(
    client: Any, run: FlowRun | None, max_age_hours: float, dry_run: bool
) -> tuple[str, float | None, bool, str]:
    """(state name, age in hours, remove?, reason) for the flow run owning a branch."""
    if run is None:
        return "unknown", None, False, "flow run not found in this Prefect API; kept"
    state = run.state
    state_type = state.type if state else None
    name = state.name if state else "none"
    if state_type in _WAITING_STATES:
        return name, None, False, "flow run is scheduled (a retry will reuse the branch); kept"
    if state_type in _LIVE_STATES:
        alive = process_alive(run.infrastructure_pid, run.start_time)
        if alive is None:
            return (
                name,
                None,
                False,
                f"flow run is {name} on {run.infrastructure_pid or 'an unknown host'}; kept",
            )
        if alive:
            return name, None, False, f"flow run is {name} (process {run.infrastructure_pid} alive); kept"
        message = f"process {run.infrastructure_pid} is gone; marked crashed by the tokenlake janitor"
        if not dry_run:
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
        name = "Crashed"
        ended = datetime.now(UTC)
    else:
        ended = run.end_time or (state.timestamp if state else None) or run.start_time or run.created
    age = (datetime.now(UTC) - ended).total_seconds() / 3600 if ended else float("inf")
    if age < max_age_hours:
        return name, age, False, f"flow run ended {age:.2f} h ago, younger than {max_age_hours:g} h; kept"
    return name, age, True, f"flow run is {name} and ended {age:.2f} h ago"


def sweep(repo: DataRepo, max_age_hours: float = 24.0, dry_run: bool = False) -> list[Verdict]:
    """Judge every run branch and the publish lock; remove the orphans (unless ``dry_run``)."""
    verdicts = []
    with get_client(sync_client=True) as client:
        for branch in sorted(repo.list_branches()):
            if branch.startswith(RUN_BRANCH_PREFIX):
                flow_run_id = flow_run_of_branch(branch) or ""
                run = _read_flow_run(client, flow_run_id)
                state, age, remove, reason = _judge_run(client, run, max_age_hours, dry_run)
            elif branch == PUBLISH_LOCK_BRANCH:
                flow_run_id, state, age, remove, reason = _judge_lock(client, repo, dry_run)
            else:
                continue
            if remove and not dry_run:
                try:
                    repo.delete_branch(branch)
                except NotFound:
                    pass  # removed by someone else meanwhile
            age_hours = None if age is None or age == float("inf") else round(age, 3)
            verdicts.append(Verdict(branch, flow_run_id, state, age_hours, remove and not dry_run, reason))
    return verdicts


def _judge_lock(client: Any, repo: DataRepo, dry_run: bool) -> tuple[str, str, float | None, bool, str]:
    holder = publish_in_progress(repo)
    if holder is None:
        return "", "none", None, False, "lock released meanwhile"
    if not holder["flow_run_id"]:
        return "", "unknown", None, True, "publish lock without a holder (its process died while taking it)"
    run = _read_flow_run(client, holder["flow_run_id"])
    alive = process_alive(f"{holder['host']}:{holder['pid']}", run.start_time if run else None)
    if alive is False or (run is not None and run.state and run.state.is_final()):
        return (
            holder["flow_run_id"],
            run.state.name if run and run.state else "unknown",
            None,
            True,
            ("publish lock held by a dead process"),
        )
    return holder["flow_run_id"], "alive", None, False, "a publish is in progress; kept"


@task(name="janitor-sweep", **IO_RETRIES)
def sweep_task(repository: str | None, max_age_hours: float, dry_run: bool) -> list[Verdict]:
    return sweep(open_repo(repository, create=False), max_age_hours, dry_run)


@flow(name="janitor", log_prints=True)
def janitor(params: JanitorParams = JanitorParams()) -> list[dict[str, Any]]:
    """Remove branches of dead curate runs older than ``max_age_hours`` (and a dead publish lock)."""
    verdicts = sweep_task(params.repository, params.max_age_hours, params.dry_run)
    rows = [asdict(v) for v in verdicts]
    if rows:
        create_table_artifact(rows, key="janitor", description="run branches judged by the janitor")
    removed = [v.branch for v in verdicts if v.removed]
    logger = get_run_logger()
    logger.info(
        "janitor: removed %d branch(es)%s", len(removed), f": {', '.join(removed)}" if removed else ""
    )
    scratch = sweep_scratch(params.dry_run)
    if scratch:
        create_table_artifact(
            [asdict(v) for v in scratch], key="janitor-scratch", description="scratch left by dead processes"
        )
    logger.info(
        "janitor: %s %d scratch entr(ies) of dead processes%s", "found" if params.dry_run else "removed",
        len(scratch), f": {', '.join(v.path for v in scratch)}" if scratch else "",
    )  # fmt: skip
    return rows
