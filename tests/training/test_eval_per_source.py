"""Held-out loss per source of the mix: in metrics.jsonl, checkpoints, the summary and the plot.

Each evaluation's per-source losses are checked against a direct computation: the
checkpoint of that step loaded into a plain GPT, each source's held-out sequences scored
with the model's own loss. On 1 rank (in this process) and on 2 (torchrun, DDP) alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.helpers import (
    Dataset,
    final_weights,
    make_config,
    make_dataset,
    torchrun,
)
from training.checkpoint import list_checkpoints
from training.config import TrainConfig
from training.data import ShardCache, open_dataset
from training.metrics import last_per_step, loss_lines, read_metrics, summarize, summary_table
from training.model import GPT
from training.trainer import train
from versioning.local import LocalRepo

pytestmark = pytest.mark.slow
SEQ_TOKENS = 32  # tokens scored per held-out sequence (seq_len of the synthetic dataset)
# Float32 on the CPU (both runs, whatever the machine): the trainer scores sequences one at a time and sums per source in float64,
# the direct computation takes one mean per source; only the rounding of the sums differs.
REL = 1e-5


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("per-source"))


def direct_losses(config: TrainConfig, step: int) -> tuple[dict[str, float], float]:
    """(per source, over all) mean held-out loss of the step's checkpoint, computed here."""
    ds = LocalRepo(config.repo)
    _, data = open_dataset(
        ds, config.repo, config.commit, ShardCache(config.run_dir() / "direct-cache"),
        config.data.heldout_fraction, True, lambda: None,
    )  # fmt: skip
    model = GPT(config.model.gpt_config(data.manifest.vocab_size, data.seq_len))
    model.load_state_dict(final_weights(config.run_dir(), step))
    model.eval()
    sources, indices = data.heldout_ids(config.data.eval_sequences)
    by_source = {}
    with torch.no_grad():
        for number, name in enumerate(data.plan.source_names):
            mine = sources == number
            rows = torch.from_numpy(data.rows(sources[mine], indices[mine]))
            by_source[name] = model(rows[:, :-1], rows[:, 1:])[1].item()
        rows = torch.from_numpy(data.rows(sources, indices))
        overall = model(rows[:, :-1], rows[:, 1:])[1].item()
    return by_source, overall


def held_out_counts(config: TrainConfig) -> dict[str, int]:
    """Held-out sequences per source in the evaluation set (16 taken round-robin: 8 and 8)."""
    _, data = open_dataset(
        LocalRepo(config.repo), config.repo, config.commit, ShardCache(config.run_dir() / "direct-cache"),
        config.data.heldout_fraction, True, lambda: None,
    )  # fmt: skip
    sources, _ = data.heldout_ids(config.data.eval_sequences)
    return {name: int(np.sum(sources == i)) for i, name in enumerate(data.plan.source_names)}


def check_evaluations(config: TrainConfig) -> list[dict]:
    """Every eval record against the direct computation on its step's checkpoint."""
    records = read_metrics(config.run_dir() / "metrics.jsonl")
    evals = last_per_step(records, "eval")
    assert [r["step"] for r in evals] == [8, 16]
    counts = held_out_counts(config)
    assert counts == {"web": 8, "code": 8}
    for record in evals:
        by_source, overall = direct_losses(config, record["step"])
        assert record["eval_tokens_by_source"] == {name: n * SEQ_TOKENS for name, n in counts.items()}
        assert set(record["eval_loss_by_source"]) == {"web", "code"}
        for name, loss in by_source.items():
            assert record["eval_loss_by_source"][name] == pytest.approx(loss, rel=REL)
        assert record["eval_loss"] == pytest.approx(overall, rel=REL)
    return records


def test_per_source_losses_equal_a_direct_computation_and_reach_summary_plot_and_checkpoint(dataset):
    config = make_config(dataset, "one-rank", report=True, device="cpu")
    train(config)
    records = check_evaluations(config)
    evals = last_per_step(records, "eval")

    # the evaluation's cost is inside the step's time, and shown on its own
    train_steps = {r["step"]: r for r in last_per_step(records, "train")}
    for record in evals:
        step = train_steps[record["step"]]
        assert step["eval_ms"] == record["eval_ms"] > 0
        assert step["step_ms"] >= step["eval_ms"]
    assert all("eval_ms" not in r for s, r in train_steps.items() if s not in (8, 16))

    summary = summarize(records)
    last, first = evals[-1]["eval_loss_by_source"], evals[0]["eval_loss_by_source"]
    for name in ("web", "code"):
        assert summary[f"eval_loss/{name}"] == last[name]
        assert summary[f"eval_loss_change/{name}"] == pytest.approx(last[name] - first[name])
    eval_time = sum(r["eval_ms"] for r in evals)
    assert summary["eval_share"] == pytest.approx(eval_time / sum(r["step_ms"] for r in train_steps.values()))
    table = (config.run_dir() / "summary.md").read_text()
    assert table == summary_table(summary)
    assert f"| eval_loss/web | {last['web']:.4g} |" in table
    assert f"| eval_loss_change/code | {last['code'] - first['code']:+.4g} |" in table

    lines = loss_lines(records)
    assert list(lines) == ["train", "eval (held out)", "eval: code", "eval: web"]  # sources by name
    for name in ("web", "code"):
        assert lines[f"eval: {name}"] == ([8, 16], [r["eval_loss_by_source"][name] for r in evals])
    assert (config.run_dir() / "loss.png").stat().st_size > 0

    final = list_checkpoints(config.run_dir() / "checkpoints")[-1].meta["metrics"]
    assert final["eval_loss_by_source"] == last and final["eval_loss"] == evals[-1]["eval_loss"]


def test_two_ranks_all_reduce_each_source_and_match_the_direct_computation(dataset):
    config = make_config(dataset, "two-ranks", device="cpu")
    result = torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-4000:]
    # tokens of each source counted once over both ranks, losses those of the job's own weights
    check_evaluations(config)
