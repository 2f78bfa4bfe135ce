"""Chaos campaign, curate flow: SIGKILL ``tokenlake curate`` at random moments, re-run, and check
that nothing was lost, doubled or half-published.

    .venv/bin/python benchmarks/chaos/curate_kills.py [--kills 30] [--code-mb 0.4] [--prose-mb 0.3]
                                                      [--seed 0] [--work DIR]

Load: ``tokenlake curate`` on small demo sources (a sample of the Python standard library as
code, installed packages' metadata and license files as prose; ``flows.demo_sources``), a
local repository, a Prefect API server started for the campaign.

* An uninterrupted run on a fresh repository is the reference: the published objects (every
  path outside ``reports/``: documents, quarantine, tokenizer, shards, manifest, mix) and
  their sha256s.
* Each trial: a fresh repository; ``tokenlake curate`` is SIGKILLed at a random moment of its
  run. The aim cycles: any moment (uniform over the reference run's duration), or a random
  moment of one stage (validate, dedup, shard, mix) or of the publish (gates, lock, merge,
  tag): from the event that starts it (the previous stage's commit on the run branch) plus a
  uniform delay over that stage's duration in the reference run. Odd trials kill the whole process tree
  (as a container kill does), even trials the main process only (as the OOM killer does; its
  worker processes are orphaned). Then ``tokenlake curate`` again, then
  ``tokenlake janitor --max-age 0``.
* Checked per trial: every head ``main`` took (polled every few milliseconds throughout) is
  a complete publish (a publish commit whose shards all match its manifest) or holds no
  dataset at all (the initial commit, the publish guard's installation); the re-run exits 0; ``main`` holds exactly one publish; its objects equal the
  reference's byte for byte; no stage output holds a document twice; after the janitor only
  ``main`` is left.

Results: ``benchmarks/results/chaos_curate.json``. Last line:
``chaos_curate: kills=<n> ok=<k>/<n> ...``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import ROOT, alive, descendants, kill_tree, machine, wait_gone, write_results
from curate_support import (
    content,
    differences,
    duplicated_documents,
    fully_published,
    janitor_verdicts,
    prefect_server,
    publishes_on_main,
    tokenlake,
    write_demo_config,
)

from flows.wap import LOCK_CANDIDATE_SUFFIX, MAIN, PUBLISH_LOCK_BRANCH, RUN_BRANCH_PREFIX, PublishRecord
from formats.layout import STAGES
from versioning.local import LocalRepo


class MainWatcher:
    """Polls ``main``'s head of a repository (from its creation on) and keeps every head seen."""

    def __init__(self, repo_path: Path):
        self.repo_path = repo_path
        self.heads: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        repo = None
        while not self._stop.is_set():
            try:
                repo = repo or (LocalRepo(self.repo_path) if (self.repo_path / "repo.db").exists() else None)
                head = repo.resolve(MAIN) if repo else None
            except Exception:  # the repository is being created
                head = None
            if head and (not self.heads or self.heads[-1] != head):
                self.heads.append(head)
            time.sleep(0.005)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        return self.heads


def where_it_died(repo: LocalRepo) -> str:
    """The part of the run a kill landed in, read off the repository after it."""
    branches = repo.list_branches()
    if PublishRecord.from_commit(repo.get_commit(branches[MAIN])) is not None:
        return "after the merge into main"
    if PUBLISH_LOCK_BRANCH in branches or any(b.endswith(LOCK_CANDIDATE_SUFFIX) for b in branches):
        return "publish"
    runs = [b for b in branches if b.startswith(RUN_BRANCH_PREFIX)]
    if not runs:
        return "startup"
    stage = repo.get_commit(branches[runs[0]]).metadata.get("stage")
    done = STAGES.index(stage) + 1 if stage in STAGES else 0
    return STAGES[done] if done < len(STAGES) else "gates and publish"


AIMS = ("any moment", "validate", "dedup", "shard", "mix", "publish")


@dataclass
class Trial:
    number: int
    mode: str
    aimed_at: str
    after_s: float = 0.0
    landed_in: str = ""
    orphans_left: int = 0
    problems: list[str] = field(default_factory=list)
    rerun_s: float = 0.0
    janitor_removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def repo_dir(home: Path) -> Path:
    return home / "repo"


@dataclass(frozen=True)
class Reference:
    seconds: float
    content: dict[str, str]
    tag: str
    windows: dict[str, float]  # aim -> seconds from its start event to its end, in the reference run


def reference(config: Path, env: dict[str, str], work: Path) -> Reference:
    home = work / "reference"
    env = {**env, "TOKENLAKE_HOME": str(home)}
    started = time.monotonic()
    out = tokenlake(
        ["--repo", str(repo_dir(home)), "curate", "--config", str(config), "--json"],
        env,
        work / "reference.log",
    )
    seconds = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"the reference run failed; see {work / 'reference.log'}")
    repo = LocalRepo(repo_dir(home))
    created = {c.metadata.get("stage"): c.created for c in repo.log(MAIN)}
    # a stage runs from the previous stage's commit to its own; the publish from mix's commit to the merge
    windows = {
        stage: max(created[stage] - created[previous], 0.05)
        for previous, stage in zip(STAGES, [*STAGES[1:], "publish"], strict=True)
    }
    return Reference(seconds, content(repo, MAIN), json.loads(out.stdout)["tag"], windows)


def wait_for_stage(repo_path: Path, stage: str, process: subprocess.Popen) -> bool:
    """Until a run branch's head is ``stage``'s commit (True), or the run ends (False)."""
    repo = None
    while process.poll() is None:
        try:
            repo = repo or (LocalRepo(repo_path) if (repo_path / "repo.db").exists() else None)
            if repo and any(
                b.startswith(RUN_BRANCH_PREFIX) and repo.get_commit(h).metadata.get("stage") == stage
                for b, h in repo.list_branches().items()
            ):
                return True
        except Exception:  # the repository is being created
            pass
        time.sleep(0.005)
    return False


def aim(trial: Trial, ref: Reference, repo_path: Path, process: subprocess.Popen, rng: random.Random) -> None:
    """Wait for a random moment of the trial's aim: the whole run, one stage, or the publish."""
    started = time.monotonic()
    if trial.aimed_at == "any moment":
        deadline = started + rng.uniform(0, ref.seconds)
    else:
        previous = dict(zip([*STAGES[1:], "publish"], STAGES, strict=True))[trial.aimed_at]
        if not wait_for_stage(repo_path, previous, process):
            return
        deadline = time.monotonic() + rng.uniform(0, ref.windows[trial.aimed_at])
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.002)


def run_trial(trial: Trial, config: Path, env: dict[str, str], work: Path, ref: Reference,
              rng: random.Random) -> bool:  # fmt: skip
    """One kill, a re-run, the janitor, the checks; False when the run ended before the kill."""
    home = work / f"trial-{trial.number:03d}"
    env = {**env, "TOKENLAKE_HOME": str(home)}
    log = home / "run.log"
    home.mkdir(parents=True)
    watcher = MainWatcher(repo_dir(home))
    command = [
        sys.executable,
        "-m",
        "flows.cli",
        "--repo",
        str(repo_dir(home)),
        "curate",
        "--config",
        str(config),
    ]
    with log.open("ab") as f:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=f, stderr=f, start_new_session=True)
    started = time.monotonic()
    aim(trial, ref, repo_dir(home), process, rng)
    if process.poll() is not None:
        watcher.stop()
        return False
    if trial.mode == "tree":
        killed = kill_tree(process.pid)
    else:
        killed = descendants(process.pid)  # orphaned, left to notice on their own
        process.kill()
    trial.after_s = round(time.monotonic() - started, 2)
    process.wait()
    if trial.mode == "main-only" and not wait_gone(killed, 60):
        trial.orphans_left = sum(alive(p) for p in killed)
        trial.problems.append(f"{trial.orphans_left} orphaned worker(s) still running 60 s after the kill")
        for pid in killed:
            kill_tree(pid)

    repo = LocalRepo(repo_dir(home)) if (repo_dir(home) / "repo.db").exists() else None
    if repo:
        trial.landed_in = where_it_died(repo)
    else:
        trial.landed_in = "startup"

    rerun_started = time.monotonic()
    out = tokenlake(["--repo", str(repo_dir(home)), "curate", "--config", str(config), "--json"], env, log)
    trial.rerun_s = round(time.monotonic() - rerun_started, 1)
    heads = watcher.stop()
    if out.returncode != 0:
        trial.problems.append(f"the re-run failed with status {out.returncode} (see {log})")
        return True
    repo = LocalRepo(repo_dir(home))
    for head in heads:
        if why := fully_published(repo, head):
            trial.problems.append(why)
    if (count := publishes_on_main(repo)) != 1:
        trial.problems.append(f"main holds {count} publishes, not 1")
    trial.problems += [f"published dataset: {d}" for d in differences(ref.content, content(repo, MAIN))]
    trial.problems += duplicated_documents(repo, MAIN)

    janitor = tokenlake(["--repo", str(repo_dir(home)), "janitor", "--max-age", "0", "--json"], env, log)
    trial.janitor_removed = [v["branch"] for v in janitor_verdicts(janitor) if v.get("removed")]
    left = sorted(set(repo.list_branches()) - {MAIN})
    if janitor.returncode != 0 or left:
        trial.problems.append(f"after the janitor (status {janitor.returncode}) branches are left: {left}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--code-mb", type=float, default=0.4)
    parser.add_argument("--prose-mb", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()
    machine_at_start = machine()

    started = time.monotonic()
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="chaos-curate-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = write_demo_config(work, args.code_mb, args.prose_mb)
        with prefect_server(work / "prefect") as env:
            ref = reference(config, env, work)
            windows = ", ".join(f"{k} {v:.1f} s" for k, v in ref.windows.items())
            print(f"reference: {ref.seconds:.1f} s ({windows}), {len(ref.content)} objects published as {ref.tag}",
                  flush=True)  # fmt: skip
            number = 0
            while len(trials) < args.kills:
                trial = Trial(number, "tree" if number % 2 else "main-only", AIMS[len(trials) % len(AIMS)])
                number += 1
                if not run_trial(trial, config, env, work, ref, rng):
                    print(f"trial {trial.number}: the run ended before its kill; not counted", flush=True)
                    continue
                trials.append(trial)
                verdict = "ok" if trial.ok else "FAILED: " + "; ".join(trial.problems)
                print(f"trial {trial.number} ({trial.mode}, aimed at {trial.aimed_at}): killed after {trial.after_s} s "
                      f"in {trial.landed_in}; re-run {trial.rerun_s} s; janitor removed {trial.janitor_removed}; "
                      f"{verdict}", flush=True)  # fmt: skip
    ok = sum(t.ok for t in trials)
    landed = Counter(t.landed_in for t in trials)
    summary = {"kills": len(trials), "ok": ok, "landed_in": dict(landed), "reference_seconds": round(ref.seconds, 1),
               "reference_windows_s": {k: round(v, 2) for k, v in ref.windows.items()},
               "published_objects": len(ref.content), "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    path = write_results(
        "curate",
        {
            "command": f"benchmarks/chaos/curate_kills.py --kills {args.kills} --code-mb {args.code_mb} "
            f"--prose-mb {args.prose_mb} --seed {args.seed}",
            "load": {"sources": "demo sources (flows.demo_sources)", "code_mb": args.code_mb,
                     "prose_mb": args.prose_mb, "repository": "local", "machine": machine_at_start},
            "summary": summary,
            "trials": [asdict(t) | {"ok": t.ok} for t in trials],
        },
    )  # fmt: skip
    print(f"results: {path}")
    places = " ".join(f"{k.replace(' ', '_')}={v}" for k, v in sorted(landed.items()))
    print(f"chaos_curate: kills={len(trials)} ok={ok}/{len(trials)} landed[{places}] "
          f"reference={ref.seconds:.0f}s seconds={summary['seconds']:.0f}")  # fmt: skip
    return 0 if ok == len(trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
