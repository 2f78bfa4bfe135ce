"""The one liveness test every owner check uses (versioning/liveness.py), on real processes."""

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime

from versioning.liveness import pid_alive, process_alive


def test_a_running_process_is_alive_and_a_reaped_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        assert process_alive(f"{socket.gethostname()}:{child.pid}", None) is True
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)
    assert process_alive(f"{socket.gethostname()}:{child.pid}", None) is False


def test_a_killed_child_not_yet_reaped_is_dead():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGKILL)
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie
        assert not pid_alive(child.pid)
    finally:
        child.wait()


def test_a_pid_reused_by_a_later_process_is_not_the_owner():
    started_before_this_process = time.time() - 3600
    assert pid_alive(os.getpid())
    assert not pid_alive(os.getpid(), started=started_before_this_process)
    assert process_alive(f"{socket.gethostname()}:{os.getpid()}", datetime.now(UTC)) is True


def test_another_host_or_no_owner_cannot_be_told():
    assert process_alive("elsewhere:1", None) is None
    assert process_alive(None, None) is None
    assert process_alive("no-pid-here", None) is None
