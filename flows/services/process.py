"""One service as a child process on 127.0.0.1: started, waited for, stopped, killed, restarted.

What a service is (its command line, its environment, how to tell it is ready) lives in the
modules beside this one; this is only the life cycle they share. A service's output goes to a log
file in its work directory, never to the console, since the environment it gets carries the
credentials it was started with.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

STOP_GRACE_S = 10.0


class ServiceFailed(RuntimeError):
    """A service did not start, or died; the message names it and its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ServiceProcess:
    """A child process with a readiness probe; ``start`` returns once the probe says ready."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        ready: Callable[[], bool],
        *,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ):
        self.name = name
        self.argv = argv
        self.workdir = Path(workdir)
        self.ready = ready
        self.env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self.log_path = self.workdir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"ServiceProcess({self.name!r}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.workdir,
                env=os.environ | self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is the owner's to forward
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._probe():
            if not self.running():
                raise ServiceFailed(
                    f"{self.name} exited with status {self.process.returncode} while starting; "
                    f"its log: {self.log_path}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceFailed(
                    f"{self.name} was not ready {self.startup_timeout_s:.0f} s after it started; "
                    f"its log: {self.log_path}\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _probe(self) -> bool:
        try:
            return self.ready()
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; a stopped service stays stopped."""
        if not self.running():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown of its own runs."""
        if self.running():
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
