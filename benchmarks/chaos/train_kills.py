"""Chaos campaign, training: SIGKILL whole torchrun jobs (and single workers) at random moments,
relaunch, and compare everything with an uninterrupted run, bit for bit.

    .venv/bin/python benchmarks/chaos/train_kills.py [--kills 100] [--worker-kills 10]
                                                     [--kills-per-trial 5] [--seed 0] [--work DIR]

Load: 2 torchrun processes on CPU (gloo), the tiny GPT, a synthetic dataset commit in a local
repository (``training.synthetic``), ``--steps`` steps with an asynchronous checkpoint every
``--every`` steps, evaluation, lineage records.

* An uninterrupted run is the reference (losses, final weights, optimizer state, RNG/schedule
  state, loader position).
* Job kills: each trial is one run name, launched and SIGKILLed (torchrun and both workers at
  the same moment) ``--kills-per-trial`` times, then launched to the end. Each kill aims at a
  phase in turn (startup; inside a step; inside an asynchronous save; inside the final save)
  and lands at a random moment in it: a random delay after launch, after a random step is
  logged, or after a random save's temporary directory appears. Where it really landed is
  read off the disk after the kill (a ``.tmp-step-*`` directory left: inside that save).
* Worker kills: one worker (rank 0 or 1, alternately) is SIGKILLed inside a random step; the
  survivor and torchrun must exit on their own (no hang), and the relaunch must resume.
* Checked per trial: every logged loss (first runs and replays) equals the reference's for
  its step; each launch resumed from the newest checkpoint that verified when the job died;
  the final model, optimizer and run state and the loader position equal the reference's; no
  partial save is left; the final checkpoint's lineage record is on branch ``runs``.

Results: ``benchmarks/results/chaos_train.json``. Last line:
``chaos_train: kills=<n> exact=<k>/<n> ... worker_kills=<m> exact=<j>/<m> hangs=<h>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch  # noqa: E402
from common import ROOT, alive, children, kill_tree, machine, wait_gone, write_results

from formats.layout import LINEAGE_BRANCH, checkpoint_record_path  # noqa: E402
from tests.training.helpers import make_config, make_dataset, newest_durable_step, torchrun_command  # noqa: E402
from training.checkpoint import step_dir_name  # noqa: E402
from training.config import CheckpointConfig, TrainConfig  # noqa: E402
from training.metrics import read_metrics  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

PHASES = ("startup", "step", "save", "final-save")
_TMP_SAVE = re.compile(r"^\.tmp-step-(\d+)-\d+$")
LAUNCH_TIMEOUT_S = 600.0
PAYLOAD = ("model.pt", "optim.pt", "state.pt")


def job_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class Launch:
    """One torchrun job of a run, with a view of what it has written so far."""

    def __init__(self, config: TrainConfig, log: Path):
        self.config = config
        self.run_dir = config.run_dir()
        self.metrics = self.run_dir / "metrics.jsonl"
        # after the last complete line: the trainer cuts off a line torn by a kill before appending
        self.offset = self.metrics.read_bytes().rfind(b"\n") + 1 if self.metrics.exists() else 0
        self._pending = b""
        self.records: list[dict[str, Any]] = []
        self.resume_seen_at: float | None = None
        self.started = time.monotonic()
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            torchrun_command(config, 2), cwd=ROOT, env=job_env(), stdout=self._log, stderr=self._log,
            start_new_session=True,
        )  # fmt: skip

    def poll_records(self) -> list[dict[str, Any]]:
        """Metrics records this launch has written (complete lines only)."""
        if self.metrics.exists():
            with self.metrics.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            lines = (self._pending + data).split(b"\n")
            self._pending = lines.pop()
            self.records += [json.loads(line) for line in lines if line.strip()]
            if self.resume_seen_at is None and any(r["kind"] == "resume" for r in self.records):
                self.resume_seen_at = time.monotonic()
        return self.records

    def train_steps(self) -> list[int]:
        return [r["step"] for r in self.poll_records() if r["kind"] == "train"]

    def saves_in_flight(self) -> list[int]:
        directory = self.run_dir / "checkpoints"
        if not directory.is_dir():
            return []
        return sorted(int(m.group(1)) for e in os.scandir(directory) if (m := _TMP_SAVE.match(e.name)))

    def workers(self) -> dict[int, int]:
        """rank -> pid of the worker processes."""
        ranks = {}
        for pid in children(self.proc.pid):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((int(v.split(b"=", 1)[1]) for v in env if v.startswith(b"RANK=")), None)
            if rank is not None:
                ranks[rank] = pid
        return ranks

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.close()

    def close(self) -> None:
        if not self._log.closed:
            self._log.close()


def wait_until(launch: Launch, condition, poll_s: float = 0.001) -> bool:
    """Poll ``condition`` until it holds (True) or the job ends (False)."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while launch.poll_records() is not None and not condition():
        if launch.finished() or time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


@dataclass
class Timings:
    """From the reference run: how long startup, a step and a save take on this machine now."""

    startup_s: float
    step_s: float
    save_s: float
    total_s: float


def watch_saves(run_dir: Path, stop: threading.Event, lifetimes: list[float]) -> None:
    """How long each ``.tmp-step-*`` directory lives (polled every millisecond)."""
    seen: dict[str, float] = {}
    directory = run_dir / "checkpoints"
    while not stop.is_set():
        now = time.monotonic()
        names = (
            {e.name for e in os.scandir(directory) if _TMP_SAVE.match(e.name)}
            if directory.is_dir()
            else set()
        )
        for name in names - seen.keys():
            seen[name] = now
        for name in [n for n in seen if n not in names]:
            lifetimes.append(now - seen.pop(name))
        time.sleep(0.001)


def reference_run(config: TrainConfig, logs: Path) -> Timings:
    stop, lifetimes = threading.Event(), []
    watcher = threading.Thread(target=watch_saves, args=(config.run_dir(), stop, lifetimes), daemon=True)
    watcher.start()
    launch = Launch(config, logs / f"{config.run}.log")
    first_step = None
    while not launch.finished():
        if first_step is None and launch.train_steps():
            first_step = time.monotonic() - launch.started
        time.sleep(0.005)
    total = time.monotonic() - launch.started
    rc = launch.wait()
    stop.set()
    watcher.join()
    if rc != 0:
        raise SystemExit(f"the reference run failed (status {rc}); see {logs / config.run}.log")
    records = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "train"]
    step_s = sorted(r["step_ms"] for r in records)[len(records) // 2] / 1000
    save_s = sorted(lifetimes)[len(lifetimes) // 2] if lifetimes else 0.02
    return Timings(startup_s=first_step or total, step_s=step_s, save_s=save_s, total_s=total)


# ---- comparing a run with the reference ------------------------------------------------------


def tensors_equal(a: Any, b: Any) -> bool:
    """Deep equality in which tensors must be bit-identical (dtype, shape, values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        )  # fmt: skip
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def final_state(run_dir: Path, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    path = run_dir / "checkpoints" / step_dir_name(step)
    payload = {name: torch.load(path / name, map_location="cpu", weights_only=True) for name in PAYLOAD}
    meta = json.loads((path / "meta.json").read_text())
    return payload, {k: meta[k] for k in ("step", "tokens", "loader", "rollbacks", "data_changes", "data")}


def compare(run_dir: Path, reference: dict[str, Any], steps: int) -> list[str]:
    """Every difference between a finished run and the reference, as sentences (empty: exact)."""
    problems = []
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except json.JSONDecodeError as exc:
        return [f"metrics.jsonl does not parse: {exc}"]
    losses = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    wrong = [(s, loss) for s, loss in losses if reference["losses"].get(s) != loss]
    if wrong:
        problems.append(f"{len(wrong)} logged losses differ from the reference, first at step {wrong[0][0]}")
    if {s for s, _ in losses} != set(reference["losses"]):
        problems.append("the logged steps are not the reference's steps")
    evals = {r["step"]: r["eval_loss"] for r in records if r["kind"] == "eval"}
    if any(reference["evals"].get(s) != v for s, v in evals.items()):
        problems.append("an evaluation loss differs from the reference")
    try:
        payload, meta = final_state(run_dir, steps)
    except (OSError, RuntimeError, json.JSONDecodeError) as exc:
        return [*problems, f"no final checkpoint: {exc}"]
    for name in PAYLOAD:
        if not tensors_equal(payload[name], reference["payload"][name]):
            problems.append(f"final {name} differs from the reference")
    if meta != reference["meta"]:
        problems.append("final step, tokens, loader position or data binding differ from the reference")
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    if leftovers:
        problems.append(f"partial saves left behind: {leftovers}")
    return problems


def lineage_recorded(repo: LocalRepo, run: str, step: int) -> bool:
    return LINEAGE_BRANCH in repo.list_branches() and repo.exists(
        LINEAGE_BRANCH, checkpoint_record_path(run, step)
    )


# ---- the campaign ---------------------------------------------------------------------------


@dataclass
class Kill:
    trial: str
    number: int
    kind: str  # "job" or "worker"
    aimed_at: str
    landed_in: str
    after_s: float
    durable_step: int | None  # where the relaunch must resume (None: start fresh)
    resumed_at: int | None = None
    detail: str = ""


@dataclass
class Trial:
    name: str
    kills: list[Kill] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    resumes: list[int | None] = field(
        default_factory=list
    )  # per launch: the step it resumed at (None: died first)
    hang: bool = False

    @property
    def exact(self) -> bool:
        return not self.problems and not self.hang


def resume_step(launch: Launch) -> int | None:
    return next((r["step"] for r in launch.poll_records() if r["kind"] == "resume"), None)


def landed_in(launch: Launch, steps: int) -> str:
    """Where a kill of the whole job landed, read off the disk after it."""
    records = launch.poll_records()
    in_flight = launch.saves_in_flight()
    if in_flight:
        return "final-save" if max(in_flight) == steps else "save"
    if not any(r["kind"] == "resume" for r in records):
        return "startup"
    if (launch.run_dir / "checkpoints" / step_dir_name(steps) / "COMPLETE").exists():
        return "after-final-save"
    return "step"


class Campaign:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.dataset = make_dataset(work / "data")
        self.repo = LocalRepo(self.dataset.repo)
        self.trials: list[Trial] = []
        self.startups: list[float] = []

    def config(self, run: str) -> TrainConfig:
        return make_config(
            self.dataset, run, steps=self.args.steps,
            checkpoint=CheckpointConfig(every=self.args.every, keep_last=3),
            data=make_config(self.dataset, run).data.model_copy(update={"cache_dir": str(self.work / "cache" / run)}),
        )  # fmt: skip

    def prepare_reference(self) -> None:
        config = self.config("reference")
        self.timings = reference_run(config, self.logs)
        records = read_metrics(config.run_dir() / "metrics.jsonl")
        payload, meta = final_state(config.run_dir(), self.args.steps)
        self.reference = {
            "losses": {r["step"]: r["loss"] for r in records if r["kind"] == "train"},
            "evals": {r["step"]: r["eval_loss"] for r in records if r["kind"] == "eval"},
            "payload": payload,
            "meta": meta,
        }

    def note_startup(self, launch: Launch) -> None:
        """Remember how long this launch took to reach its resume record (its startup)."""
        if launch.resume_seen_at is not None:
            self.startups.append(launch.resume_seen_at - launch.started)

    def save_steps(self, after: int | None) -> list[int]:
        """Checkpointed steps after ``after`` and before the last (step 0 when starting fresh)."""
        steps = self.args.steps
        every = self.args.every
        return [s for s in range(0, steps, every) if after is None or s > after]

    def aim(self, launch: Launch, phase: str, durable: int | None) -> str:
        """Wait for a random moment of ``phase``; returns a note on the aim ('' when hit as planned)."""
        t = self.timings
        steps = self.args.steps
        if phase == "startup":
            # startup time swings with the machine's load: aim within the recent launches' startups
            recent = sorted(self.startups[-9:]) or [t.startup_s]
            delay = self.rng.uniform(0, recent[len(recent) // 2])
            return (
                ""
                if wait_until(launch, lambda: time.monotonic() - launch.started >= delay)
                else "job ended first"
            )
        if phase == "step":
            target = self.rng.randint((durable or 0) + 1, steps - 1)
            if not wait_until(launch, lambda: any(s >= target for s in launch.train_steps())):
                return "job ended first"
            time.sleep(self.rng.uniform(0, t.step_s))
            return ""
        targets = (self.save_steps(durable) if phase == "save" else []) or [steps]
        target = self.rng.choice(targets)
        done = launch.run_dir / "checkpoints" / step_dir_name(target) / "COMPLETE"
        # a save of ``target`` in flight; a complete one that was not there at launch means it was missed
        existed = done.exists()
        hit = wait_until(
            launch, lambda: target in launch.saves_in_flight() or (not existed and done.exists())
        )
        if not hit:
            return "job ended first"
        if target not in launch.saves_in_flight():
            return f"save of step {target} finished before it was seen"
        time.sleep(self.rng.uniform(0, t.save_s))
        return ""

    def job_kill(self, trial: Trial, config: TrainConfig, phase: str) -> bool:
        """Launch, kill the whole job in ``phase``; False when the job finished before the kill."""
        durable_before = newest_durable_step(config)
        launch = Launch(config, self.logs / f"{config.run}.log")
        note = self.aim(launch, phase, durable_before)
        if launch.finished():
            launch.wait()
            trial.resumes.append(resume_step(launch))
            self.note_startup(launch)
            return False
        killed = kill_tree(launch.proc.pid)
        after = time.monotonic() - launch.started
        self.note_startup(launch)
        launch.wait(timeout=60)
        if not wait_gone(killed, 60):
            trial.hang = True
        trial.resumes.append(resume_step(launch))
        trial.kills.append(
            Kill(trial.name, len(trial.kills) + 1, "job", phase, landed_in(launch, self.args.steps), round(after, 3),
                 newest_durable_step(config), detail=note)
        )  # fmt: skip
        return True

    def worker_kill(self, trial: Trial, config: TrainConfig, rank: int) -> None:
        launch = Launch(config, self.logs / f"{config.run}.log")
        target = self.rng.randint(1, self.args.steps - 1)
        if not wait_until(launch, lambda: any(s >= target for s in launch.train_steps())):
            launch.wait()
            trial.problems.append(f"the job ended before step {target}: no worker was killed")
            return
        time.sleep(self.rng.uniform(0, self.timings.step_s))
        workers = launch.workers()
        if rank not in workers:
            kill_tree(launch.proc.pid)
            launch.wait()
            trial.problems.append(f"rank {rank}'s process was not found: no worker was killed")
            return
        os.kill(workers[rank], signal.SIGKILL)
        killed_at = time.monotonic()
        others = [pid for r, pid in workers.items() if r != rank]
        rc = launch.wait(timeout=120)
        trial.resumes.append(resume_step(launch))
        exit_s = time.monotonic() - killed_at
        if rc is None or not wait_gone(others, 10):
            trial.hang = True
            kill_tree(launch.proc.pid)
            for pid in others:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            note = f"torchrun or rank {1 - rank} still running {exit_s:.0f} s after the kill"
        else:
            note = f"torchrun exited with status {rc} {exit_s:.2f} s after the kill, the other rank too"
            if rc == 0:
                trial.problems.append("torchrun reported success although a worker was killed")
        trial.kills.append(
            Kill(trial.name, len(trial.kills) + 1, "worker", f"step (rank {rank})",
                 "step" if not launch.saves_in_flight() else "save", round(killed_at - launch.started, 3),
                 newest_durable_step(config), detail=note)
        )  # fmt: skip

    def finish(self, trial: Trial, config: TrainConfig) -> None:
        launch = Launch(config, self.logs / f"{config.run}.log")
        rc = launch.wait()
        launch.poll_records()
        if rc is None:
            trial.hang = True
            kill_tree(launch.proc.pid)
            trial.problems.append(f"the final launch did not end within {LAUNCH_TIMEOUT_S:.0f} s")
            return
        if rc != 0:
            trial.problems.append(
                f"the final launch failed with status {rc} (see {self.logs / config.run}.log)"
            )
            return
        trial.resumes.append(resume_step(launch))
        # launch i+1 must resume where kill i left the newest durable checkpoint (unless it died first)
        for kill, step in zip(trial.kills, trial.resumes[1:], strict=False):
            kill.resumed_at = step
            if step is not None and step != (kill.durable_step or 0):
                trial.problems.append(
                    f"kill {kill.number}: resumed at step {step}, but the newest durable checkpoint was "
                    f"{kill.durable_step}"
                )
        trial.problems += compare(config.run_dir(), self.reference, self.args.steps)
        if not lineage_recorded(self.repo, config.run, self.args.steps):
            trial.problems.append("no lineage record of the final checkpoint on branch runs")

    def run_job_kills(self) -> None:
        kills_done, number = 0, 0
        while kills_done < self.args.kills:
            trial = Trial(f"job-{number:03d}")
            number += 1
            config = self.config(trial.name)
            budget = min(self.args.kills_per_trial, self.args.kills - kills_done)
            while len(trial.kills) < budget and (newest_durable_step(config) or -1) < self.args.steps:
                # a job that ended before its kill leaves the run finished: the loop stops there
                if self.job_kill(trial, config, PHASES[kills_done % len(PHASES)]):
                    kills_done += 1
            self.finish(trial, config)
            self.trials.append(trial)
            self.report_progress(trial)

    def run_worker_kills(self) -> None:
        for i in range(self.args.worker_kills):
            trial = Trial(f"worker-{i:03d}")
            config = self.config(trial.name)
            self.worker_kill(trial, config, rank=i % 2)
            self.finish(trial, config)
            self.trials.append(trial)
            self.report_progress(trial)

    def report_progress(self, trial: Trial) -> None:
        where = ", ".join(f"{k.aimed_at}->{k.landed_in}@{k.durable_step}" for k in trial.kills)
        verdict = (
            "exact"
            if trial.exact
            else "NOT EXACT: " + "; ".join(trial.problems) + (" (hang)" if trial.hang else "")
        )
        print(f"{trial.name}: {len(trial.kills)} kill(s) [{where}] {verdict}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs of the whole job")
    parser.add_argument("--worker-kills", type=int, default=10, help="SIGKILLs of one worker")
    parser.add_argument(
        "--kills-per-trial", type=int, default=5, help="kills of one run before it may finish"
    )
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()
    machine_at_start = machine()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chaos-train-") as tmp:
        work = args.work or Path(tmp)
        campaign = Campaign(args, work)
        campaign.prepare_reference()
        print(f"reference: {asdict(campaign.timings)}", flush=True)
        campaign.run_job_kills()
        campaign.run_worker_kills()
    trials = campaign.trials
    job = [k for t in trials for k in t.kills if k.kind == "job"]
    worker = [k for t in trials for k in t.kills if k.kind == "worker"]
    exact = {t.name for t in trials if t.exact}
    job_exact = sum(k.trial in exact for k in job)
    worker_exact = sum(k.trial in exact for k in worker)
    hangs = sum(t.hang for t in trials)
    landed = Counter(k.landed_in for k in job)
    summary = {
        "job_kills": len(job),
        "job_kills_exact": job_exact,
        "job_kills_landed_in": dict(landed),
        "worker_kills": len(worker),
        "worker_kills_exact": worker_exact,
        "trials": len(trials),
        "trials_exact": len(exact),
        "hangs": hangs,
        "seconds": round(time.monotonic() - started, 1),
    }
    path = write_results(
        "train",
        {
            "command": "benchmarks/chaos/train_kills.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "work"
            ),
            "load": {"processes": 2, "backend": "gloo (CPU)", "model": "tiny", "steps": args.steps,
                     "checkpoint_every": args.every, "machine": machine_at_start},
            "reference_timings": asdict(campaign.timings),
            "summary": summary,
            "trials": [{"name": t.name, "exact": t.exact, "hang": t.hang, "problems": t.problems,
                        "kills": [asdict(k) for k in t.kills]} for t in trials],
        },
    )  # fmt: skip
    print(f"results: {path}")
    places = " ".join(f"{k}={v}" for k, v in sorted(landed.items()))
    print(
        f"chaos_train: kills={len(job)} exact={job_exact}/{len(job)} landed[{places}] "
        f"worker_kills={len(worker)} exact={worker_exact}/{len(worker)} hangs={hangs} "
        f"seconds={summary['seconds']:.0f}"
    )
    return 0 if job_exact == len(job) and worker_exact == len(worker) and not hangs else 1


if __name__ == "__main__":
    raise SystemExit(main())
