"""training.launch without a job: torchrun commands, configuration errors, the launch file, the pod entrypoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.training.helpers import ROOT
from training.launch import FLOW_FAILED_EXIT, LaunchConfig, follower_job, torchrun_command, write_launch_file


def test_one_node_is_standalone_and_more_use_the_c10d_rendezvous(tmp_path):
    one = torchrun_command(LaunchConfig(nproc_per_node=2), tmp_path / "c.json")
    assert one[3:6] == ["--standalone", "--nproc-per-node=2", "--max-restarts=0"] and one[-3:] == [
        "training",
        "--config",
        str(tmp_path / "c.json"),
    ]
    many = LaunchConfig(nnodes=4, nproc_per_node=8, rdzv_endpoint="n0:29400", rdzv_id="job", max_restarts=3)
    assert many.world_size == 32 and many.environment() == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert many.torchrun_args() == [
        "--nnodes=4", "--nproc-per-node=8", "--max-restarts=3", "--rdzv-backend=c10d",
        "--rdzv-endpoint=n0:29400", "--rdzv-id=job",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"nnodes": 2}, "needs rdzv_endpoint"),
        ({"nnodes": 2, "rdzv_endpoint": "n0:29400"}, "needs rdzv_endpoint"),
        ({"rdzv_endpoint": "n0"}, "must be host:port"),
        ({"rdzv_id": "a b"}, "must be letters"),
    ],
)
def test_a_misconfigured_job_is_one_sentence(fields, error):
    with pytest.raises(ValueError, match=error):
        LaunchConfig(**fields)


def test_a_follower_runs_the_launching_node_s_job_as_a_client(tmp_path):
    launch = LaunchConfig(nnodes=2, rdzv_endpoint="n0:29400", rdzv_id="job-1", rdzv_is_host=True)
    write_launch_file(tmp_path, launch, tmp_path / "run.json")
    followed, config = follower_job(tmp_path, "job-1", timeout_s=1)
    assert followed == launch.model_copy(update={"rdzv_is_host": False}) and config == tmp_path / "run.json"
    assert "--rdzv-conf=is_host=false" in followed.torchrun_args()
    with pytest.raises(TimeoutError, match="no launch file"):
        follower_job(tmp_path, "job-2", timeout_s=0.2, poll_s=0.05)


def pod(index: int, *command: str, timeout: str = "60") -> subprocess.CompletedProcess:
    args = [
        sys.executable, "-m", "training.launch", "pod", "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-endpoint=job-0.svc:29400", "--rdzv-id=job", f"--timeout={timeout}", "--", *command,
    ]  # fmt: skip
    env = {**os.environ, "JOB_COMPLETION_INDEX": str(index), "TOKENLAKE_HOME": str(ROOT / ".no-such-home")}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_pod_0_runs_the_flow_command_with_the_job_s_shape_and_reports_its_failure():
    check = "import os, sys; sys.exit(0 if os.environ['TOKENLAKE_NNODES'] == '2' and os.environ['TOKENLAKE_RDZV_ID'] == 'job' else 3)"
    assert pod(0, sys.executable, "-c", check).returncode == 0
    assert pod(0, sys.executable, "-c", "raise SystemExit(1)").returncode == FLOW_FAILED_EXIT


def test_other_pods_follow_and_wait_for_the_launch_file():
    result = pod(1, "never", "run", timeout="0.3")
    assert result.returncode != 0 and "no launch file" in result.stderr
