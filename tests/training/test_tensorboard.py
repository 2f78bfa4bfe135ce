"""TensorBoard event files, read back with TensorBoard's own EventAccumulator.

On: rank 0 writes the scalars of metrics.jsonl at their steps, and what TensorBoard shows
after a rollback or a kill and resume is each step once, with its last record's values.
Off: no event file, and neither ``tensorboard`` nor ``torch.utils.tensorboard`` imported.
Missing: one sentence saying how to install it, before anything starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.training.helpers import ROOT, Dataset, make_config, make_dataset, torchrun, windows
from training.config import CheckpointConfig, FaultConfig, TrainConfig
from training.errors import TrainingError
from training.metrics import last_per_step, read_metrics
from training.tensorboard_log import EVAL_LOSS, EVAL_LOSS_OF_SOURCE, TRAIN_SCALARS
from training.trainer import train

pytestmark = pytest.mark.slow
EVENTS = "events.out.tfevents.*"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("tensorboard"))


def scalars(config: TrainConfig) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run directory's event files: (step, value) in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(config.run_dir()), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def check_against_metrics(config: TrainConfig) -> dict[str, list[tuple[int, float]]]:
    """The event files say what the last record of each step in metrics.jsonl says."""
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    train_records, evals = last_per_step(records, "train"), last_per_step(records, "eval")
    found = scalars(config)
    expected = {
        tag: [(r["step"], np.float32(r[key])) for r in train_records if r.get(key) is not None]
        for key, tag in TRAIN_SCALARS.items()
    }
    expected[EVAL_LOSS] = [(r["step"], np.float32(r["eval_loss"])) for r in evals]
    for name in ("web", "code"):
        expected[EVAL_LOSS_OF_SOURCE.format(name)] = [
            (r["step"], np.float32(r["eval_loss_by_source"][name])) for r in evals
        ]
    assert found == {tag: values for tag, values in expected.items() if values}  # event values are float32
    assert [step for step, _ in found["train/loss"]] == list(range(1, config.steps + 1))
    assert [step for step, _ in found["perf/ckpt_stall_ms"]] == [4, 8, 12, 16]
    assert [step for step, _ in found[EVAL_LOSS]] == [step for step, _ in found["perf/eval_ms"]] == [8, 16]
    return found


def test_scalars_are_the_metrics_of_each_step_once_after_a_rollback(dataset, tmp_path):
    spike = windows(dataset, tmp_path, 10, [])[9]  # step 10's samples: rolled back to step 8
    config = make_config(
        dataset, "tb-rollback", tensorboard=True, peak_flops=1e12, device="cpu",
        faults=FaultConfig(spike_at_positions=(spike[0],)),
    )  # fmt: skip
    train(config)
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    assert [(r["at_step"], r["to_step"]) for r in records if r["kind"] == "rollback"] == [(10, 8)]
    assert [r["step"] for r in records if r["kind"] == "train"].count(9) == 2  # replayed in metrics.jsonl
    found = check_against_metrics(config)  # once in TensorBoard, with the replay's values
    assert set(found) == {*TRAIN_SCALARS.values(), EVAL_LOSS, "eval/loss/web", "eval/loss/code"}
    assert len(list(config.run_dir().glob(EVENTS))) == 1


def test_two_ranks_killed_and_resumed_rank_zero_alone_writes_each_step_once(dataset):
    config = make_config(
        dataset, "tb-ranks", tensorboard=True, device="cpu", checkpoint=CheckpointConfig(every=4, keep_last=3),
        faults=FaultConfig(kill_at_steps=(11,)),
    )  # fmt: skip
    killed = torchrun(config, 2)
    assert killed.returncode != 0
    assert (
        max(r["step"] for r in read_metrics(config.run_dir() / "metrics.jsonl") if r["kind"] == "train") == 10
    )
    resumed = torchrun(config, 2)  # from the step-8 checkpoint: steps 9 and 10 are trained again
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    check_against_metrics(config)
    # one event file per rank-0 process; rank 1 would have added one to each
    assert len(list(config.run_dir().glob(EVENTS))) == 2


def test_off_writes_no_events_and_imports_no_tensorboard(dataset):
    config = make_config(dataset, "tb-off", device="cpu", steps=8)
    assert config.tensorboard is False  # the default
    script = (
        "import json, sys; from training.config import TrainConfig; from training.trainer import train; "
        f"train(TrainConfig.model_validate_json({config.model_dump_json()!r})); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorboard' "
        "or m.startswith('torch.utils.tensorboard'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert (config.run_dir() / "metrics.jsonl").exists()
    assert not list(config.run_dir().glob(EVENTS))


def test_on_without_the_package_stops_before_anything_with_the_install_command(dataset, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it finds
    config = make_config(dataset, "tb-missing", tensorboard=True, device="cpu")
    with pytest.raises(TrainingError, match=r"pip install tensorboard") as refused:
        train(config)
    assert str(refused.value).count(". ") == 0  # one sentence
    assert not config.run_dir().exists()  # refused before the run directory, the data or the model


def test_the_cli_flag_turns_it_on_and_refuses_in_one_sentence_without_the_package(
    dataset, monkeypatch, capsys
):
    from flows.cli import main
    from flows.train import TrainParams

    config = TrainParams(tensorboard=True, repo=str(dataset.repo)).train_config(
        dataset.commit, flow_run_id=""
    )
    assert config.tensorboard is True
    assert (
        TrainParams(repo=str(dataset.repo)).train_config(dataset.commit, flow_run_id="").tensorboard is False
    )

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    code = main(["--repo", str(dataset.repo), "train", "--dataset", dataset.commit, "--tensorboard"])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "pip install tensorboard" in error[0]
