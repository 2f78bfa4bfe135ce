"""Lineage queries: what data a checkpoint was trained on, and which checkpoints a data version trained.

Pure functions over a :class:`~versioning.DataRepo` (no Prefect). Everything they read is in
the dataset repository, so they answer the same on both adapters:

* branch ``runs`` (one listing, then the records a query needs, read in parallel):

  - ``runs/<run>/checkpoints/step-NNNNNNN.json``: one per saved checkpoint, written by the
    trainer (:mod:`training.lineage`): the checkpoint's ``meta.json`` without the config;
  - ``runs/<run>/events/<kind>-step-NNNNNNN.json``: rollbacks of a diverging run, a resume on
    other data (``data-change``), a run forked from another run's checkpoint (``fork``);
  - ``runs/<run>/taints/step-NNNNNNN.json``: ``{"marks": [...]}``, one mark per dataset
    rollback that found the checkpoint trained on data no longer on ``main``
    (:mod:`flows.rollback`); a tainted checkpoint is never deleted;
  - ``runs/_rollbacks/<tag>.json``: one record per rollback of ``main``.

  Whether a checkpoint is tainted is decided from its data commit and the recorded rollbacks
  (:mod:`formats.rollbacks`), whenever it was saved; marks record what each rollback found.

* the data commits: a publish merge names its stage chain (:class:`flows.wap.PublishRecord`),
  each stage commit carries its config hash and flow-run id, the ingest report names the
  sources, and ``shards/manifest.json`` + ``mix.json`` turn a training step's global sample
  positions into (source, shard, sequence): :mod:`flows.step_samples`.

A checkpoint is named ``RUN@STEP`` or by its directory on disk; a data version by tag,
branch or commit id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flows.wap import published_record
from formats import layout
from formats.layout import LINEAGE_BRANCH
from formats.rollbacks import RecordedRollbacks, Reverted, restored_from
from training.checkpoint import META
from versioning import DataRepo, NotFound

READ_WORKERS = 16  # records are small; on lakeFS each read is one HTTP round trip

CHECKPOINT_REF = re.compile(r"^(?P<run>[A-Za-z0-9][A-Za-z0-9._-]{0,99})@(?P<step>\d+)$")


class LineageError(ValueError):
    """A lineage question that cannot be answered; the message says what to give instead."""


@dataclass(frozen=True)
class TaintMark:
    """One rollback's verdict on one checkpoint: trained on data that left ``main``."""

    rollback: str  # the rollback's tag
    target: str  # the commit main was restored to
    data_commit: str
    reason: str
    marked_at: float


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint as lineage knows it: the trainer's record, the verdict on its data, the taint marks.

    ``tainted`` is the verdict (:mod:`formats.rollbacks`): its data commit holds data a rollback
    took off main. ``taints`` are the marks rollbacks wrote; a checkpoint saved (or recorded)
    after the rollback that reverted its data is tainted before any mark names it, until
    ``tokenlake rollback`` runs again and marks it."""

    run: str
    step: int
    data_commit: str
    tokens: int
    metrics: dict[str, Any]
    checkpoint: str  # the checkpoint's directory on the machine that trained it
    flow_run_id: str
    saved_at: float
    taints: tuple[TaintMark, ...] = ()
    reverted: Reverted | None = None
    record: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.run}@{self.step}"

    @property
    def tainted(self) -> bool:
        return self.reverted is not None

    @property
    def marked(self) -> bool:
        """A mark of the rollback that reverted its data is on ``runs``."""
        return self.reverted is not None and any(m.rollback == self.reverted.rollback for m in self.taints)

    @classmethod
    def from_record(
        cls, record: dict[str, Any], taints: Iterable[TaintMark] = (), reverted: Reverted | None = None
    ) -> CheckpointRecord:
        return cls(
            run=str(record["run"]),
            step=int(record["step"]),
            data_commit=str((record.get("data") or {}).get("commit", "")),
            tokens=int(record.get("tokens", 0)),
            metrics=dict(record.get("metrics") or {}),
            checkpoint=str(record.get("checkpoint", "")),
            flow_run_id=str(record.get("flow_run_id", "")),
            saved_at=float(record.get("saved_at", 0.0)),
            taints=tuple(taints),
            reverted=reverted,
            record=record,
        )

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the record's facts, without the loader state."""
        return {
            "checkpoint": self.name,
            "run": self.run,
            "step": self.step,
            "tokens": self.tokens,
            "data_commit": self.data_commit,
            "metrics": self.metrics,
            "tainted": self.tainted,
            "tainted_by": self.reverted.rollback if self.reverted else "",
            "taint_reason": self.reverted.reason if self.reverted else "",
            "marked": self.marked,
            "taints": [mark.__dict__ for mark in self.taints],
            "path": self.checkpoint,
            "flow_run_id": self.flow_run_id,
        }


StepSelector = Callable[[list[int]], Iterable[int]]


@dataclass
class LineageIndex:
    """The lineage records on branch ``runs`` at one commit, from one listing."""

    commit: str | None  # None when branch ``runs`` does not exist yet
    checkpoints: list[CheckpointRecord]  # the records read: every one, or those a selector chose
    events: list[dict[str, Any]]
    rollbacks: list[dict[str, Any]]
    listed: dict[str, list[int]] = field(default_factory=dict)  # run -> every checkpoint step listed
    history: RecordedRollbacks | None = None  # every rollback (records and tags): the taint verdicts

    def of_run(self, run: str) -> list[CheckpointRecord]:
        return [c for c in self.checkpoints if c.run == run]

    def find(self, run: str, step: int) -> CheckpointRecord | None:
        return next((c for c in self.checkpoints if c.run == run and c.step == step), None)

    def trained_on(self, commit_id: str) -> list[CheckpointRecord]:
        return [c for c in self.checkpoints if c.data_commit == commit_id]


def read_json_objects(repo: DataRepo, ref: str, paths: list[str]) -> list[Any]:
    """The JSON objects at ``paths``, read in parallel (order kept)."""
    if len(paths) <= 1:
        return [json.loads(repo.get(ref, p)) for p in paths]
    with ThreadPoolExecutor(max_workers=min(READ_WORKERS, len(paths))) as pool:
        return list(pool.map(lambda p: json.loads(repo.get(ref, p)), paths))


def read_lineage(repo: DataRepo, run: str | None = None, select: StepSelector | None = None) -> LineageIndex:
    """The records under ``runs/`` (or one run's, plus the rollback records) at ``runs``' head.

    Events, taint marks and rollback records are always read (there are few); checkpoint
    records all, or with ``select`` only the steps it picks from each run's listed steps."""
    try:
        commit = repo.resolve(LINEAGE_BRANCH)
    except NotFound:
        return LineageIndex(None, [], [], [], history=RecordedRollbacks.read(repo, recorded=[]))
    prefixes = [f"{layout.run_records(run)}/", f"{layout.ROLLBACK_RECORDS}/"] if run else [f"{layout.RUNS}/"]
    paths = [stat.path for prefix in prefixes for stat in repo.list(commit, prefix)]
    checkpoint_paths = {_run_step(m): p for p in paths if (m := layout.CHECKPOINT_RECORD.match(p))}
    listed: dict[str, list[int]] = {}
    for run_name, step in sorted(checkpoint_paths):
        listed.setdefault(run_name, []).append(step)
    if select is not None:
        chosen = {(name, step) for name, steps in listed.items() for step in select(steps)}
        checkpoint_paths = {key: p for key, p in checkpoint_paths.items() if key in chosen}
    taint_paths = {_run_step(m): p for p in paths if (m := layout.TAINT_RECORD.match(p))}
    event_paths = [p for p in paths if layout.EVENT_RECORD.match(p)]
    rollback_paths = [p for p in paths if layout.ROLLBACK_RECORD.match(p)]
    wanted = [*checkpoint_paths.values(), *taint_paths.values(), *event_paths, *rollback_paths]
    body = dict(zip(wanted, read_json_objects(repo, commit, wanted), strict=True))

    marks = {key: [TaintMark(**mark) for mark in body[p].get("marks", [])] for key, p in taint_paths.items()}
    checkpoints = [
        CheckpointRecord.from_record(body[p], marks.get(key, ()))
        for key, p in sorted(checkpoint_paths.items())
    ]
    rollbacks = sorted((body[p] for p in rollback_paths), key=lambda r: r.get("created", 0.0))
    history = RecordedRollbacks.read(repo, recorded=rollbacks)
    verdicts = history.verdicts(c.data_commit for c in checkpoints)
    checkpoints = [replace(c, reverted=verdicts.get(c.data_commit)) for c in checkpoints]
    events = []
    for path in event_paths:
        match = layout.EVENT_RECORD.match(path)
        assert match is not None
        events.append({"run": match["run"], "kind": match["kind"], "step": int(match["step"]), **body[path]})
    return LineageIndex(commit, checkpoints, events, rollbacks, listed, history)


def _run_step(match: re.Match[str]) -> tuple[str, int]:
    return match["run"], int(match["step"])


# ---- data versions -----------------------------------------------------------------------


@dataclass(frozen=True)
class StageCommit:
    """One curate stage of a data version: the commit that ended it and what made it."""

    stage: str
    commit: str
    config_hash: str
    flow_run_id: str
    input_commit: str


@dataclass(frozen=True)
class DataVersion:
    """What a data commit is: a publish (its merge, tag and stage chain), a rollback, or a plain commit."""

    commit: str
    kind: str  # "publish", "rollback", "revert", "restore", a stage name, or "commit"
    message: str
    tags: tuple[str, ...]
    publish_commit: str  # the publish merge whose content this commit holds ("" if none)
    publish_tag: str
    publish_flow_run_id: str
    restores: str  # for rollback commits: the commit whose content main was restored to
    stages: tuple[StageCommit, ...]
    sources: tuple[dict[str, Any], ...]
    reverted_by: tuple[str, ...]  # the tag of the rollback that took this data off main (formats.rollbacks)


def describe_data(repo: DataRepo, ref: str, index: LineageIndex | None = None) -> DataVersion:
    """The publish, stage chain and sources behind the data commit ``ref`` resolves to."""
    commit = repo.get_commit(repo.resolve(ref))
    tags = tuple(sorted(t for t, c in repo.list_tags().items() if c == commit.id))
    kind = commit.metadata.get("stage") or "commit"
    restores = restored_from(repo, commit.metadata)
    record = published_record(repo, commit.id)
    if record is not None:
        stages = tuple(_stage_commit(repo, link.stage, link.commit) for link in record.chain)
    else:
        stages = _stage_chain(repo, commit.id)
    history = (
        index.history if index is not None and index.history is not None else RecordedRollbacks.read(repo)
    )
    verdict = history.verdict(commit.id)
    return DataVersion(
        commit=commit.id,
        kind=kind,
        message=commit.message,
        tags=tags,
        publish_commit=record.commit if record else "",
        publish_tag=record.tag if record else "",
        publish_flow_run_id=record.flow_run_id if record else "",
        restores=restores,
        stages=stages,
        sources=_sources(repo, stages),
        reverted_by=(verdict.rollback,) if verdict else (),
    )


def _stage_commit(repo: DataRepo, stage: str, commit_id: str) -> StageCommit:
    meta = repo.get_commit(commit_id).metadata
    return StageCommit(
        stage=stage,
        commit=commit_id,
        config_hash=meta.get("stage_config_hash", ""),
        flow_run_id=meta.get("flow_run_id", ""),
        input_commit=meta.get("input_commit", ""),
    )


def _stage_chain(repo: DataRepo, commit_id: str) -> tuple[StageCommit, ...]:
    """An unpublished commit of a curate run: its stage commits, found by walking first parents."""
    found = []
    commit = repo.get_commit(commit_id)
    while commit.metadata.get("stage") in layout.STAGES:
        found.append(_stage_commit(repo, commit.metadata["stage"], commit.id))
        if not commit.parents:
            break
        commit = repo.get_commit(commit.parents[0])
    return tuple(reversed(found))


def _sources(repo: DataRepo, stages: tuple[StageCommit, ...]) -> tuple[dict[str, Any], ...]:
    """The source sections the ingest stage ran with (as its report records them)."""
    ingest = next((s for s in stages if s.stage == "ingest"), None)
    if ingest is None:
        return ()
    try:
        report = json.loads(repo.get(ingest.commit, layout.report_path("ingest")))
    except NotFound:
        return ()
    configured = (report.get("extra") or {}).get("sources")
    if configured:
        return tuple(configured)
    counts = {
        "documents_in",
        "kept",
        "rejected",
        "partitions",
        "parts",
        "raw_parts",
    }  # raw_parts: reports before 0.2
    return tuple(
        {"name": name, **{k: v for k, v in stats.items() if k not in counts}}
        for name, stats in sorted((report.get("per_source") or {}).items())
    )


# ---- checkpoints -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointLineage:
    checkpoint: CheckpointRecord
    data: DataVersion
    events: tuple[dict[str, Any], ...]  # the run's events up to this checkpoint's step


def find_checkpoint(repo: DataRepo, name: str) -> CheckpointRecord:
    """``RUN@STEP`` or a checkpoint directory on disk -> its lineage record (read alone)."""
    return _find(repo, name)[0]


def _find(repo: DataRepo, name: str) -> tuple[CheckpointRecord, LineageIndex]:
    directory = Path(name)
    if (directory / META).is_file():
        meta = json.loads((directory / META).read_text())
        run, step = str(meta["run"]), int(meta["step"])
    elif match := CHECKPOINT_REF.match(name):
        run, step, meta = match["run"], int(match["step"]), None
    else:
        raise LineageError(f"{name!r} is neither a checkpoint directory nor RUN@STEP")
    index = read_lineage(repo, run, select=lambda steps: [step])
    found = index.find(run, step)
    if found is not None:
        return found, index
    if meta is not None:  # its lineage record is still queued on the training machine
        record = {k: v for k, v in meta.items() if k != "config"} | {"checkpoint": str(directory.resolve())}
        assert index.history is not None
        return CheckpointRecord.from_record(
            record, reverted=index.history.verdict(meta["data"]["commit"])
        ), index
    steps = ", ".join(map(str, index.listed.get(run, []))) or "none"
    raise LineageError(
        f"no lineage record for checkpoint {run}@{step} on branch {LINEAGE_BRANCH!r} "
        f"(run {run!r} has checkpoints at steps: {steps})"
    )


def checkpoint_lineage(repo: DataRepo, name: str) -> CheckpointLineage:
    """Everything lineage knows about one checkpoint: its data version, stage chain, sources, events."""
    checkpoint, index = _find(repo, name)
    events = tuple(e for e in index.events if e["run"] == checkpoint.run and e["step"] <= checkpoint.step)
    return CheckpointLineage(checkpoint, describe_data(repo, checkpoint.data_commit, index), events)


def checkpoints_on(repo: DataRepo, ref: str, index: LineageIndex | None = None) -> list[CheckpointRecord]:
    """Every checkpoint of every run trained on the commit ``ref`` resolves to, by run and step."""
    commit_id = repo.resolve(ref)
    return (index or read_lineage(repo)).trained_on(commit_id)


def training_config(checkpoint: CheckpointRecord) -> dict[str, Any]:
    """The run's TrainConfig as a dict: from the record, the checkpoint's meta.json or the run's config.json."""
    if "config" in checkpoint.record:
        return dict(checkpoint.record["config"])
    directory = Path(checkpoint.checkpoint)
    for path in (directory / META, directory.parent.parent / "config.json"):
        if path.is_file():
            loaded = json.loads(path.read_text())
            return dict(loaded.get("config", loaded))
    raise LineageError(
        f"the training config of run {checkpoint.run!r} is not in its lineage record and neither "
        f"{directory / META} nor {directory.parent.parent / 'config.json'} exists on this machine; "
        "ask on the machine that trained it"
    )
