"""``tokenlake export`` proved by transformers itself (offline): the export loads with
AutoModelForCausalLM / AutoTokenizer, encodes as tokenlake does, gives tokenlake's logits and
greedy tokens; from an in-process run, a 2-process DDP run and a 2-process FSDP2 run (torchrun,
gloo). And the refusals: a tainted checkpoint, an unknown run or step, a non-empty destination."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from flows.cli import main as tokenlake  # noqa: E402
from flows.export import export_checkpoint  # noqa: E402
from flows.lineage import read_lineage  # noqa: E402
from flows.restore import plan_rollback, restore_main  # noqa: E402
from flows.taint import find_tainted, mark_tainted, rollback_record  # noqa: E402
from tasks.tokenize import BatchEncoder  # noqa: E402
from tests.training.helpers import Dataset, device_for_ranks, torchrun  # noqa: E402
from tests.training.helpers import make_config as make_job_config  # noqa: E402
from tests.training.tokenized_dataset import EOD, publish_tokenized_version  # noqa: E402
from training.config import CheckpointConfig, DataConfig, ModelConfig  # noqa: E402
from training.model import GPT, GPTConfig  # noqa: E402
from training.trainer import train  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog.", "def f3(x):\n    return x * 7 + 3\n",
         f"shard {EOD} commit: tokens ünïcödé"]  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    home = tmp_path_factory.mktemp("export")
    repo = LocalRepo(home / "repo")
    repo.ensure()
    version = publish_tokenized_version(repo, "curate-1", seed=1)
    return Dataset(home, home / "repo", version.commit_id), version


def config(ds: Dataset, run: str, **fields):
    defaults = dict(
        steps=4, global_batch=8, micro_batch=2, model=ModelConfig.preset("tiny"), eval_every=4,
        data=DataConfig(heldout_fraction=0.05, eval_sequences=8, prefetch_batches=2, loader="thread"),
        checkpoint=CheckpointConfig(every=2, keep_last=5, async_save=False),
    )  # fmt: skip
    return make_job_config(ds, run, **{**defaults, **fields})


def tokenlake_model(run_dir, step: int) -> GPT:
    """tokenlake's own model with the checkpoint's weights, loaded without the exporter."""
    state = torch.load(run_dir / "checkpoints" / f"step-{step:07d}" / "model.pt", weights_only=True)
    vocab, width = state["wte.weight"].shape
    model = GPT(GPTConfig(vocab_size=vocab, block_size=state["wpe.weight"].shape[0], n_layer=2, n_head=2,
                          n_embd=width))  # fmt: skip
    model.load_state_dict(state)
    return model.eval()


def greedy(model: GPT, ids: list[int], new: int, eod: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(new):
            token = int(model(torch.tensor([out]))[0][0, -1].argmax())
            out.append(token)
            if token == eod:
                break
    return out


def check_round_trip(directory, repo: LocalRepo, commit: str, model: GPT) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.dtype == torch.float32
    ours = BatchEncoder.load(repo.get(commit, "tokenizer/tokenizer.json").decode(), "tiktoken").encode(TEXTS)
    start = 0
    for text, length in zip(TEXTS, ours.lengths, strict=True):
        assert tokenizer(text)["input_ids"] == ours.ids[start : start + length].tolist(), text
        start += int(length)
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"][:24]])
    with torch.no_grad():
        difference = (hf(ids).logits - model(ids)[0]).abs().max().item()
    assert difference <= 1e-4
    prompt = ids[0, :6].tolist()
    generated = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
    assert generated == greedy(model, prompt, 16, tokenizer.eos_token_id)


def test_an_in_process_run_exports_and_transformers_computes_what_tokenlake_does(dataset, tmp_path):
    ds, version = dataset
    cfg = config(ds, "single")
    train(cfg)
    result = export_checkpoint("single@4", tmp_path / "hf", repo_spec=str(ds.repo))
    check_round_trip(result.directory, LocalRepo(ds.repo), ds.commit, tokenlake_model(cfg.run_dir(), 4))
    lineage = json.loads((result.directory / "tokenlake_lineage.json").read_text())
    assert lineage["dataset"]["publish_tag"] == version.tag and lineage["dataset"]["data_commit"] == ds.commit
    assert [s["stage"] for s in lineage["stages"]] == ["ingest", "shard", "mix"]
    assert {s["name"] for s in lineage["sources"]} == {"code", "web"}
    assert all(s["documents"] > 0 and s["tokens"] > 0 for s in lineage["sources"])
    assert lineage["training"]["steps"] == 4 and lineage["training"]["tokens"] == 4 * 8 * 32
    assert {"loss", "eval_loss"} <= set(lineage["metrics"]) and lineage["taint"]["tainted"] is False
    card = (result.directory / "README.md").read_text()
    assert version.tag in card and ds.commit in card and "Rollback taint: none" in card
    assert all(stage["commit"] in card for stage in lineage["stages"])


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_two_process_run_exports_the_same_way(dataset, tmp_path, parallel):
    ds, _ = dataset
    device, _ = device_for_ranks(2)
    cfg = config(ds, f"two-{parallel}", parallel=parallel, device=device)
    completed = torchrun(cfg, 2)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = export_checkpoint(f"two-{parallel}@4", tmp_path / "hf", repo_spec=str(ds.repo))
    check_round_trip(result.directory, LocalRepo(ds.repo), ds.commit, tokenlake_model(cfg.run_dir(), 4))


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = tokenlake(list(args))
    err = capsys.readouterr().err.strip()
    return code, err


def test_refusals_are_one_sentence_and_exit_2(dataset, tmp_path, capsys):
    ds, version = dataset
    repo = LocalRepo(ds.repo)
    v2 = publish_tokenized_version(repo, "curate-2", seed=2)
    train(config(ds, "on-v2", commit=v2.commit_id, steps=2))
    repo_flag = ["--repo", str(ds.repo)]

    for args, expected in [
        (["nobody@2"], "no run named 'nobody'"),
        (["on-v2@3"], "run 'on-v2' has no checkpoint at step 3 (its checkpoints: steps 0, 2)"),
    ]:
        code, err = _cli(capsys, *repo_flag, "export", *args, "--to", str(tmp_path / "x"))
        assert code == 2 and expected in err and "\n" not in err, err
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    code, err = _cli(capsys, *repo_flag, "export", "on-v2@2", "--to", str(full))
    assert code == 2 and "exists and is not empty" in err and "\n" not in err
    assert [p.name for p in full.iterdir()] == ["keep.txt"]

    plan = plan_rollback(repo, version.tag)  # v2 leaves main: on-v2's checkpoints are tainted
    restored = restore_main(repo, plan, "rollback-flow")
    record = rollback_record(repo, plan, restored, "rollback-flow")
    mark_tainted(repo, find_tainted(repo, read_lineage(repo), record), record, "rollback-flow")
    code, err = _cli(capsys, *repo_flag, "export", "on-v2@2", "--to", str(tmp_path / "tainted"))
    assert (
        code == 2 and "checkpoint on-v2@2 is tainted" in err and "--allow-tainted" in err and "\n" not in err
    )
    assert not (tmp_path / "tainted").exists()
    code, _ = _cli(
        capsys, *repo_flag, "export", "on-v2@2", "--to", str(tmp_path / "tainted"), "--allow-tainted"
    )
    assert code == 0
    lineage = json.loads((tmp_path / "tainted" / "tokenlake_lineage.json").read_text())
    assert lineage["taint"]["tainted"] and lineage["taint"]["exported_with"] == "--allow-tainted"
    assert lineage["taint"]["reasons"][0]["rollback"] == restored.tag
    card = (tmp_path / "tainted" / "README.md").read_text()
    assert "TAINTED" in card and "--allow-tainted" in card and restored.tag in card
