"""The train flow: pin the dataset to a commit, run ``torchrun``, publish what the run produced.

    resolve the dataset ref -> an immutable commit id (a ref the repository lacks is refused)
    check the data            refused when a rollback of main reverted that commit, unless
                              allow_reverted (training.reverted; the trainer checks again)
    torchrun -m training     (a task with retries: a crash fails the attempt, the retry
                              resumes from the newest valid checkpoint; a refusal of the
                              trainer is not retried, it would refuse again)
    artifacts                 progress, metrics table, loss/throughput plot, checkpoints

One node runs ``torchrun --standalone``; with ``nnodes`` > 1 this flow's node hosts the c10d
rendezvous and the other nodes follow it (``training.launch``); the run directory must then
be shared storage (docs/training.md, "More than one node").

The trainer (``training/``) never imports Prefect: this flow only launches it as a
subprocess, streams its output into the Prefect log and reads the files it leaves in the
run directory.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run, task_run
from pydantic import BaseModel, ConfigDict, Field

from flows.commands.refs import resolve_ref
from flows.defaults import DEFAULT_STEPS
from flows.refusals import Refusal, retry_unless_refused
from formats.layout import MAIN
from tasks.stage_task import IO_RETRIES, retry_transient
from training.checkpoint import list_checkpoints, newest_valid
from training.config import ModelConfig, PresetName, ResumePolicy, TrainConfig
from training.errors import REFUSED_EXIT
from training.launch import LaunchConfig, torchrun_command, write_launch_file
from training.metrics import last_per_step, read_metrics, summarize, summary_table
from training.reverted import check_training_data
from training.tensorboard_log import require_tensorboard
from versioning import open_repo

_STEP_LINE = re.compile(r"^step (\d+)/(\d+) ")
_REFUSAL_LINE = re.compile(r"training: error: (.+)$")  # the trainer's sentence, before it exits REFUSED_EXIT
_INLINE_IMAGE_LIMIT = 512 << 10  # larger plots are linked as files, not inlined


class TrainParams(BaseModel):
    """The train flow's parameters (the Prefect UI renders them as a form)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(default=MAIN, description="dataset ref: a tag, branch or commit id")
    run: str | None = Field(
        default=None,
        description="run name; default: the preset and the commit's first 12 characters (tiny-2d27ba8b5bde)",
    )
    preset: PresetName = Field(default="tiny", description="model size")
    steps: int = Field(default=DEFAULT_STEPS, ge=1, description="optimizer steps to reach")
    nproc: int | None = Field(
        default=None,
        ge=1,
        description="training processes per node (torchrun --nproc-per-node); "
        "default $TOKENLAKE_NPROC_PER_NODE or 1",
    )
    nnodes: int | None = Field(
        default=None,
        ge=1,
        description="nodes (torchrun --nnodes); past 1 the c10d rendezvous replaces "
        "--standalone; default $TOKENLAKE_NNODES or 1",
    )
    rdzv_endpoint: str | None = Field(
        default=None,
        description="host:port of the rendezvous store, on this node (the flow's node hosts it); "
        "default $TOKENLAKE_RDZV_ENDPOINT",
    )
    rdzv_id: str | None = Field(
        default=None, description="the job's rendezvous id; default $TOKENLAKE_RDZV_ID, else the flow run id"
    )
    max_restarts: int = Field(
        default=0,
        ge=0,
        description="torchrun --max-restarts: restarts of every node's workers after a "
        "failure, inside one attempt (each resumes)",
    )
    resume: ResumePolicy = Field(
        default="auto",
        description="auto: continue from the newest valid checkpoint; never: refuse an existing run; "
        "allow-data-change: continue even if the checkpoint saw another data commit",
    )
    allow_reverted: bool = Field(
        default=False,
        description="train on a dataset version that a rollback of main reverted (refused otherwise); "
        "recorded in the run's lineage",
    )
    tensorboard: bool = Field(
        default=False,
        description="also write TensorBoard event files beside metrics.jsonl (rank 0; needs pip install "
        "tensorboard); the same as the train config's tensorboard key",
    )
    repo: str | None = Field(default=None, description="dataset repository; default $TOKENLAKE_REPO")
    retries: int = Field(default=2, ge=0, description="times a crashed torchrun is restarted (each resumes)")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='more TrainConfig fields, e.g. {"global_batch": 32, "checkpoint": {"every": 100}}',
    )

    def launch_config(self, flow_run_id: str) -> LaunchConfig:
        """The torchrun job: these parameters, else the ``TOKENLAKE_*`` variables a cluster job template
        sets (``deploy/kubernetes``), else one standalone node. A parameter that contradicts the
        variable the pod was started with is a misconfiguration: the pods would not match the job."""
        fields: dict[str, Any] = {"max_restarts": self.max_restarts}
        for field, variable in _LAUNCH_ENV.items():
            given, from_env = getattr(self, field), os.environ.get(variable)
            if given is not None and from_env and str(given) != from_env:
                raise ValueError(
                    f"{field}={given} contradicts ${variable}={from_env} set by this node's job template; "
                    f"drop the parameter or change the template"
                )
            value = given if given is not None else from_env
            if value is not None:
                fields[_LAUNCH_FIELD.get(field, field)] = value
        if int(fields.get("nnodes", 1)) > 1 or "rdzv_endpoint" in fields:
            fields.setdefault("rdzv_id", flow_run_id)
            fields["rdzv_is_host"] = True  # the flow's node hosts the store; the others follow it
        return LaunchConfig.model_validate(fields)

    def train_config(self, commit: str, flow_run_id: str) -> TrainConfig:
        model = {**ModelConfig.preset(self.preset).model_dump(), **self.overrides.get("model", {})}
        fields = {
            **self.overrides,
            "run": self.run or f"{self.preset}-{commit[:12]}",
            "commit": commit,
            "repo": self.repo,
            "steps": self.steps,
            "resume": self.resume,
            "allow_reverted": self.allow_reverted,
            "model": model,
            "flow_run_id": flow_run_id,
            "progress": False,  # plain "step N/M" lines: they read well in the Prefect log
        }
        if self.tensorboard:  # else the overrides' tensorboard key, if any, decides
            fields["tensorboard"] = True
        config = TrainConfig.model_validate(fields)
        if config.tensorboard:
            require_tensorboard()  # one sentence now, not a failed torchrun and its retries
        return config


_LAUNCH_ENV = {
    "nproc": "TOKENLAKE_NPROC_PER_NODE",
    "nnodes": "TOKENLAKE_NNODES",
    "rdzv_endpoint": "TOKENLAKE_RDZV_ENDPOINT",
    "rdzv_id": "TOKENLAKE_RDZV_ID",
}
_LAUNCH_FIELD = {"nproc": "nproc_per_node"}


class TrainSummary(BaseModel):
    run: str
    data_commit: str
    step: int
    trained_steps: int = 0  # by this flow run: 0 when the run was already at its steps
    checkpoint: str | None
    run_dir: str
    metrics: dict[str, Any]


@task(
    name="resolve-dataset", retries=3, retry_delay_seconds=2, retry_condition_fn=retry_transient,
    cache_policy=NO_CACHE,
)  # fmt: skip
def resolve_dataset(repo_spec: str | None, ref: str) -> str:
    """The ref's commit id; a ref the repository does not hold is a refusal naming the refs it does."""
    commit = resolve_ref(repo_spec, ref, "dataset")
    get_run_logger().info("dataset %s is commit %s", ref, commit)
    return commit


@task(name="check-reverted", cache_policy=NO_CACHE, **IO_RETRIES)
def check_reverted(repo_spec: str | None, commit: str, allow_reverted: bool) -> None:
    """Refuse (before torchrun starts) a commit that a rollback reverted, unless allowed."""
    verdict = check_training_data(open_repo(repo_spec, create=False), commit, allow_reverted)
    if verdict is not None:
        get_run_logger().warning("training on reverted data, as allowed: %s", verdict.reason)


class TrainingFailed(RuntimeError):
    """torchrun exited with an error; a retry resumes from the newest valid checkpoint."""


@Refusal.register
class TrainingRefused(TrainingFailed):
    """The trainer stopped with its sentence (``training: error: ...``, a ``TrainingError``: a
    resume the data change forbids, reverted data, a run another trainer holds): not retried,
    since it would refuse again."""


@task(name="torchrun", cache_policy=NO_CACHE, retry_condition_fn=retry_unless_refused)
def run_torchrun(config: TrainConfig, launch: LaunchConfig) -> int:
    """Launch the trainer under torchrun (this node's part of the job) and stream its output; a
    retry of this task resumes (after a crash; a refusal is not retried). Past one node, the
    launch file tells the other nodes to follow."""
    logger = get_run_logger()
    attempt = task_run.run_count
    if attempt > 1 and config.resume == "never":  # "never" refuses earlier runs, not this run's own retry
        config = config.model_copy(update={"resume": "auto"})
    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "launch-config.json"
    config_path.write_text(config.model_dump_json(indent=2))
    if not launch.standalone:
        write_launch_file(config.home_dir(), launch, config_path)
    command = torchrun_command(launch, config_path)
    logger.info("attempt %d: %s", attempt, " ".join(command))
    progress = create_progress_artifact(0.0, key=_key("train-progress", config.run), description=config.run)
    env = {**os.environ, **launch.environment(), "PYTHONUNBUFFERED": "1"}
    refusal = None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env
    ) as proc:
        for line in proc.stdout:
            line = line.rstrip()
            if match := _STEP_LINE.match(line):
                print(line)  # progress on the console; the flow's log_prints puts it in the run's log
                done, total = int(match.group(1)), int(match.group(2))
                update_progress_artifact(progress, 100.0 * done / total, description=f"step {done}/{total}")
            elif line:
                logger.info(line)
                if refusal is None and (said := _REFUSAL_LINE.search(line)):
                    refusal = said.group(1)
    if proc.returncode == REFUSED_EXIT and refusal is not None:
        raise TrainingRefused(f"the trainer refused the run: {refusal}")
    if proc.returncode != 0:
        raise TrainingFailed(
            f"torchrun exited with status {proc.returncode} (attempt {attempt}); a retry resumes from the "
            f"newest valid checkpoint in {run_dir / 'checkpoints'}"
        )
    return proc.returncode


def starting_step(config: TrainConfig) -> tuple[int, bool]:
    """(the step the run resumes from, whether it already reached ``config.steps`` on this data
    commit, so there is nothing to train)."""
    newest = newest_valid(config.run_dir() / "checkpoints", warn=lambda _: None)
    if newest is None:
        return 0, False
    same_data = newest.meta.get("data", {}).get("commit") == config.commit
    return newest.step, same_data and newest.step >= config.steps and config.resume != "never"


@task(name="publish-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(config: TrainConfig, start_step: int = 0) -> TrainSummary:
    run_dir = config.run_dir()
    records = read_metrics(run_dir / "metrics.jsonl")
    summary = summarize(records)
    create_table_artifact(
        [{"metric": k, "value": v} for k, v in summary.items()],
        key=_key("train-metrics", config.run),
        description=f"run {config.run}: medians over steady-state steps (see training.metrics)",
    )
    checkpoints = list_checkpoints(run_dir / "checkpoints")
    create_table_artifact(
        [
            {
                "step": c.step, "tokens": c.meta["tokens"], "data_commit": c.meta["data"]["commit"],
                "loss": c.meta.get("metrics", {}).get("loss"), "milestone": c.meta.get("milestone", False),
                "path": str(c.path),
            }
            for c in checkpoints
        ],
        key=_key("train-checkpoints", config.run),
        description="checkpoints kept on disk, each bound to the data commit it was trained on",
    )  # fmt: skip
    evals = last_per_step(records, "eval")
    if evals:
        create_table_artifact(
            [
                {"step": r["step"], "all sources": r["eval_loss"], **r.get("eval_loss_by_source", {})}
                for r in evals
            ],
            key=_key("train-eval", config.run),
            description="held-out loss per evaluation, over all sources and per source of the mix",
        )
    plot = run_dir / "loss.png"
    if plot.is_file():
        data = plot.read_bytes()
        url = (
            "data:image/png;base64," + base64.b64encode(data).decode()
            if len(data) <= _INLINE_IMAGE_LIMIT
            else plot.resolve().as_uri()
        )
        create_image_artifact(
            url,
            key=_key("train-plot", config.run),
            description="loss (held out: overall and per source) and tokens/s per step",
        )
    latest = checkpoints[-1] if checkpoints else None
    create_markdown_artifact(
        f"# Training run {config.run}\n\n"
        f"Data commit `{config.commit}`, {summary['steps']} steps, {summary['tokens']} tokens; "
        f"newest checkpoint `{latest.path if latest else 'none'}`.\n\n" + summary_table(summary),
        key=_key("train-summary", config.run),
    )
    return TrainSummary(
        run=config.run,
        data_commit=config.commit,
        step=summary["steps"],
        trained_steps=max(summary["steps"] - start_step, 0),
        checkpoint=str(latest.path) if latest else None,
        run_dir=str(run_dir),
        metrics=summary,
    )


def _key(prefix: str, run: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return f"{prefix}-{re.sub(r'[^a-z0-9-]+', '-', run.lower())}".strip("-")


@flow(name="train", log_prints=True)
def train_flow(params: TrainParams) -> TrainSummary:
    launch = params.launch_config(flow_run_id=str(flow_run.id or "local"))  # a misconfiguration fails first
    commit = resolve_dataset(params.repo, params.dataset)
    check_reverted(params.repo, commit, params.allow_reverted)
    config = params.train_config(commit, flow_run_id=str(flow_run.id or ""))
    start, done = starting_step(config)
    if done:
        get_run_logger().info(
            "nothing to train: the run %s is already at step %d on commit %s", config.run, start, commit
        )
    else:
        run_torchrun.with_options(retries=params.retries, retry_delay_seconds=1)(config, launch)
    return publish_artifacts(config, start_step=start)
