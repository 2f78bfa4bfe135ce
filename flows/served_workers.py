"""The Prefect workers of ``tokenlake serve``, and a stop that ends in a bounded time.

A Prefect 3.9 process worker cannot stop polling without ending the runs it started: at SIGINT
it cancels them with itself, and the server keeps them Running (PrefectHQ/prefect#22528,
#16746). ``tokenlake serve`` decides instead, so a stop takes at most ``stop_timeout +
2 * KILL_GRACE_S`` seconds and leaves no run Running:

1. at SIGTERM or SIGINT, the runs in flight (the flow-run processes below the workers) get
   ``stop_timeout`` seconds to finish; the workers keep running meanwhile, so a run they start
   in that time (a schedule falling due) is in flight too, with the same deadline;
2. then, or at a second signal, each worker is stopped (SIGINT, Prefect's own stop), what still
   runs after ``KILL_GRACE_S`` is terminated (SIGTERM, SIGKILL after ``KILL_GRACE_S``), and each
   flow run not in a final state is marked Crashed, saying why, so the UI's Retry re-runs it (a
   curate run reuses its finished stages).

Workers run in a session of their own, so a terminal's Ctrl-C reaches ``tokenlake serve`` only.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

STOP_TIMEOUT_S = 30.0  # the default time in-flight runs get to finish (`tokenlake serve --stop-timeout`)
KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL of what is still running after it
POLL_S = 0.2
FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"  # set by the worker in each flow-run process it starts


def say(message: str) -> None:
    print(f"tokenlake serve: {message}", file=sys.stderr, flush=True)


@dataclass
class ServedWorkers:
    workers: list[subprocess.Popen[Any]]
    stop_timeout: float = STOP_TIMEOUT_S
    signals: int = 0
    below: dict[int, psutil.Process] = field(default_factory=dict)  # processes the workers started
    flow_runs: dict[int, str] = field(default_factory=dict)  # pid -> the flow run it executes

    def wait(self) -> int:
        """Until every worker exits (their highest exit code), or a signal (then :meth:`stop`)."""
        previous = {
            signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            while not self.signals:
                codes = [worker.poll() for worker in self.workers]
                if all(code is not None for code in codes):
                    return max(codes)
                time.sleep(POLL_S)
            return self.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1

    def stop(self) -> int:
        self._note_processes()
        say(
            f"stopping: {len(set(self.flow_runs.values()))} run(s) in flight get {self.stop_timeout:g} s to "
            "finish (a second signal ends them now)"
        )
        deadline, signals = time.monotonic() + self.stop_timeout, self.signals
        while (
            self._running(self._flow_run_processes())
            and time.monotonic() < deadline
            and self.signals == signals
        ):
            time.sleep(POLL_S)
            self._note_processes()
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGINT)
        _, left = psutil.wait_procs(
            self._running(self._worker_processes() + list(self.below.values())), KILL_GRACE_S
        )
        if left := self._running(left):
            say(f"{len(left)} process(es) still running: terminating them")
            _end(left)
        for worker in self.workers:
            worker.wait()
        runs = set(self.flow_runs.values())
        crashed = mark_crashed(runs, "tokenlake serve stopped before the run finished")
        for run in sorted(runs):
            say(f"flow run {run}: {'marked Crashed (Retry re-runs it)' if run in crashed else 'finished'}")
        return 0

    def _note_processes(self) -> None:
        """Every process below the workers, and the flow run each executes (kept when a worker
        exits before them, since its children then belong to init)."""
        roots = self._worker_processes() + list(self.below.values())
        for root in roots:
            try:
                children = root.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                if child.pid in self.below:
                    continue
                self.below[child.pid] = child
                try:
                    run = child.environ().get(FLOW_RUN_ENV)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    run = None
                if run:
                    self.flow_runs[child.pid] = run

    def _flow_run_processes(self) -> list[psutil.Process]:
        return [self.below[pid] for pid in self.flow_runs]

    def _worker_processes(self) -> list[psutil.Process]:
        return [p for worker in self.workers if worker.poll() is None and (p := _process(worker.pid))]

    @staticmethod
    def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
        return [p for p in processes if _alive(p)]


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _end(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(processes, timeout=KILL_GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=KILL_GRACE_S)


def mark_crashed(flow_run_ids: Iterable[str], message: str) -> set[str]:
    """Mark Crashed each of these flow runs that is not in a final state; returns those marked."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    marked = set()
    try:
        with get_client(sync_client=True) as client:
            for run_id in sorted(flow_run_ids):
                run = client.read_flow_run(run_id)
                if run.state is None or not run.state.is_final():
                    client.set_flow_run_state(run_id, Crashed(message=message), force=True)
                    marked.add(run_id)
    except Exception as exc:  # the server is gone too: say so, the stop itself still ends
        say(f"could not mark the interrupted runs Crashed ({type(exc).__name__}): the janitor or the UI can")
    return marked
