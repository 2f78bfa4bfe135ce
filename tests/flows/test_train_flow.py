"""The train flow with the real Prefect API and a real torchrun: a crash, a retry that resumes, artifacts."""

from __future__ import annotations

import argparse
import json

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.commands.train import parse_overrides, register
from flows.train import TrainParams, train_flow
from tests.training.helpers import make_dataset
from training.metrics import read_metrics
from versioning.local import LocalRepo


def _artifacts(flow_run_id) -> dict:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found if a.key}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_crashed_torchrun_is_retried_resumes_and_the_run_is_published(tmp_path):
    ds = make_dataset(tmp_path)
    params = TrainParams(
        dataset="main", run="flow-run", steps=8, nproc=1, repo=str(ds.repo), retries=1,
        overrides={
            "home": str(tmp_path), "global_batch": 8, "micro_batch": 4, "eval_every": 4,
            "checkpoint": {"every": 4}, "data": {"heldout_fraction": 0.05, "eval_sequences": 16},
            "faults": {"kill_at_steps": [6]},  # the first attempt dies inside step 6
        },
    )  # fmt: skip
    state = train_flow(params, return_state=True)
    summary = state.result()
    flow_run_id = str(state.state_details.flow_run_id)

    assert (summary.step, summary.data_commit) == (8, ds.commit)
    run_dir = tmp_path / "runs" / "flow-run"
    resumed_at = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "resume"]
    assert resumed_at == [0, 4]  # the retry restarted torchrun, which resumed from step 4
    assert summary.checkpoint.endswith("step-0000008")

    artifacts = _artifacts(flow_run_id)
    keys = {"train-progress-flow-run", "train-metrics-flow-run", "train-checkpoints-flow-run",
            "train-plot-flow-run", "train-summary-flow-run"}  # fmt: skip
    assert keys <= set(artifacts)
    rows = json.loads(artifacts["train-checkpoints-flow-run"].data)
    assert [r["step"] for r in rows] == [0, 4, 8] and {r["data_commit"] for r in rows} == {ds.commit}
    assert artifacts["train-plot-flow-run"].data.startswith("data:image/png;base64,")
    record = json.loads(LocalRepo(ds.repo).get("runs", "runs/flow-run/checkpoints/step-0000008.json"))
    assert record["flow_run_id"] == flow_run_id and record["data"]["commit"] == ds.commit
    assert summary.trained_steps == 8

    # the same run again: already at step 8 on this commit, so nothing is trained (torchrun, which
    # would write a "resume" record, is not started) and the summary says so
    again = train_flow(params)
    assert (again.step, again.trained_steps, again.checkpoint) == (8, 0, summary.checkpoint)
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "resume"] == [0, 4]


def test_the_command_line_maps_onto_the_flow_parameters():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["train", "--dataset", "v3", "--preset", "small", "--nproc", "2", "--resume", "never",
         "--set", "checkpoint.every=100", "--set", "global_batch=32", "--set", "dtype=bfloat16"]
    )  # fmt: skip
    assert (args.dataset, args.preset, args.nproc, args.resume) == ("v3", "small", 2, "never")
    overrides = parse_overrides(args.overrides)
    assert overrides == {"checkpoint": {"every": 100}, "global_batch": 32, "dtype": "bfloat16"}
    config = TrainParams(dataset="v3", preset="small", overrides=overrides).train_config("ab" * 32, "")
    assert config.checkpoint.every == 100 and config.model.n_layer == 6 and config.run == "small-abababababab"
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["oops"])


def test_a_run_already_at_its_steps_says_so_instead_of_reprinting_metrics(capsys):
    from flows.commands.train import print_training
    from flows.train import TrainSummary

    done = TrainSummary(run="tiny-abababababab", data_commit="ab" * 32, step=300, trained_steps=0,
                        checkpoint="c", run_dir="d", metrics={"steps": 300, "loss": 6.2})  # fmt: skip
    print_training(done)
    out = capsys.readouterr().out
    assert out.startswith("nothing to train: the run tiny-abababababab is already at step 300 on this commit")
    assert "| metric |" not in out and "6.2" not in out, (
        "the earlier run's metrics are not shown as if this run trained"
    )
