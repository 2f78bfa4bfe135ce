"""``tokenlake export`` proved by transformers itself, offline (nothing is downloaded): the export
loads with AutoModelForCausalLM / AutoTokenizer, encodes as tokenlake does, gives tokenlake's
logits and greedy tokens; from an in-process run, a 2-process DDP run and a 2-process FSDP2 run
(torchrun, gloo on the CPU), with and without biases. And the refusals: a tainted checkpoint, one
whose weights saw reverted data before a resume moved it on, an unknown run or step, a
destination that is not empty."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # and local_files_only=True on every load: nothing is ever fetched
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from flows.cli import main as tokenlake  # noqa: E402
from flows.export import export_checkpoint  # noqa: E402
from flows.lineage import read_lineage  # noqa: E402
from flows.restore import plan_rollback, restore_main  # noqa: E402
from flows.taint import find_tainted, mark_tainted, rollback_record  # noqa: E402
from formats.mix import MixPlan  # noqa: E402
from tasks.tokenize import BatchEncoder, train_tokenizer  # noqa: E402
from tests.training.helpers import Dataset, device_for_ranks, torchrun  # noqa: E402
from tests.training.helpers import make_config as make_job_config  # noqa: E402
from tests.training.tokenized_dataset import EOD, SPECIALS, documents, publish_tokenized_version  # noqa: E402
from training.config import CheckpointConfig, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from training.export_hf import tokenizer_facts, write_model_files  # noqa: E402
from training.model import GPT, GPTConfig  # noqa: E402
from training.samples import batch_positions, samples_per_source, train_sequence_counts  # noqa: E402
from training.trainer import train  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog.", "def f3(x):\n    return x * 7 + 3\n",
         f"shard {EOD} commit: tokens ünïcödé"]  # fmt: skip


def publish(home) -> tuple[Dataset, object]:
    repo = LocalRepo(home / "repo")
    repo.ensure()
    version = publish_tokenized_version(repo, "curate-1", seed=1)
    return Dataset(home, home / "repo", version.commit_id), version


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return publish(tmp_path_factory.mktemp("export"))


def config(ds: Dataset, run: str, **fields) -> TrainConfig:
    defaults = dict(
        steps=4, global_batch=8, micro_batch=2, model=ModelConfig.preset("tiny"), eval_every=4,
        data=DataConfig(heldout_fraction=0.05, eval_sequences=8, prefetch_batches=2, loader="thread"),
        checkpoint=CheckpointConfig(every=2, keep_last=5, async_save=False),
    )  # fmt: skip
    return make_job_config(ds, run, **{**defaults, **fields})


def tokenlake_model(cfg: TrainConfig, step: int) -> GPT:
    """tokenlake's own model with the checkpoint's weights, loaded without the exporter."""
    state = torch.load(cfg.run_dir() / "checkpoints" / f"step-{step:07d}" / "model.pt", weights_only=True)
    vocab, _ = state["wte.weight"].shape
    model = GPT(
        GPTConfig(vocab_size=vocab, block_size=state["wpe.weight"].shape[0], **cfg.model.model_dump())
    )
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


def check_round_trip(directory, tokenizer_json: str, model: GPT) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf, loading = AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True, local_files_only=True
    )
    hf.eval()
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.dtype == torch.float32
    assert not any(loading.values()), loading  # every weight of GPT-2 is in the file, nothing else is
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as tokenlake's
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    ours = BatchEncoder.load(tokenizer_json, "tiktoken").encode(TEXTS)
    start = 0
    for text, length in zip(TEXTS, ours.lengths, strict=True):
        ids = tokenizer(text)["input_ids"]
        assert ids == ours.ids[start : start + length].tolist(), text
        assert tokenizer.decode(ids) == text
        start += int(length)
    ids = torch.tensor([tokenizer(" ".join(TEXTS))["input_ids"][: model.config.block_size]] * 2)
    with torch.no_grad():
        difference = (hf(ids).logits - model(ids)[0]).abs().max().item()
    assert difference <= 1e-4
    prompt = ids[0, :6].tolist()
    generated = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
    assert generated == greedy(model, prompt, 16, tokenizer.eos_token_id)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == hf.generation_config.pad_token_id


@pytest.mark.parametrize("bias", [False, True])
def test_the_model_maps_onto_gpt2_exactly_with_biases_or_without(tmp_path, bias):
    texts = documents("web", 80, 0) + documents("code", 40, 1)
    tokenizer_json = train_tokenizer(texts, 300, SPECIALS).to_str()
    facts = tokenizer_facts(tokenizer_json, 0)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=32, bias=bias).gpt_config(facts.size, 32)).eval()
    with torch.no_grad():  # every parameter away from its initial value: a swapped or missed one shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    assert model.config.vocab_size == 320 > facts.size  # padded rows travel too
    write_model_files(tmp_path, model, facts)
    check_round_trip(tmp_path, tokenizer_json, model)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["layer_norm_epsilon"] == model.ln_f.eps and hf_config["tie_word_embeddings"] is True
    assert hf_config["activation_function"] == "gelu" and hf_config["n_inner"] == 4 * 32


def test_trained_samples_per_source_are_what_the_loader_gave(dataset):
    ds, _ = dataset
    plan = MixPlan.from_json(LocalRepo(ds.repo).get(ds.commit, "mix.json"))
    space = SimpleNamespace(plan=plan, train_sequences=train_sequence_counts(plan, 0.05))
    skipped = [(40, 56), (130, 131)]  # windows a stability rollback skipped: never trained on
    cursor, read = 0, []
    for _ in range(30):
        positions, cursor = batch_positions(space, cursor, 8, skipped)
        read.append(positions)
    sources = plan.locate(np.concatenate(read))[0]
    expected = np.bincount(sources, minlength=len(plan.source_names))
    assert expected.sum() == 30 * 8 and cursor > 30 * 8  # held-out and skipped positions were passed over
    assert samples_per_source(plan, 0.05, cursor, skipped, chunk=37).tolist() == expected.tolist()


def test_an_in_process_run_exports_and_transformers_computes_what_tokenlake_does(dataset, tmp_path):
    ds, version = dataset
    cfg = config(ds, "single")
    train(cfg)
    result = export_checkpoint("single@4", tmp_path / "hf", repo_spec=str(ds.repo))
    tokenizer_json = LocalRepo(ds.repo).get(ds.commit, "tokenizer/tokenizer.json").decode()
    check_round_trip(result.directory, tokenizer_json, tokenlake_model(cfg, 4))
    assert sorted(p.name for p in result.directory.iterdir()) == sorted(result.files)
    lineage = json.loads((result.directory / "tokenlake_lineage.json").read_text())
    assert lineage["dataset"]["publish_tag"] == version.tag and lineage["dataset"]["data_commit"] == ds.commit
    assert [s["stage"] for s in lineage["stages"]] == ["ingest", "dedup", "shard", "mix"]
    sources = {s["name"]: s for s in lineage["sources"]}
    assert {name: s["documents"] for name, s in sources.items()} == {"code": 160, "web": 240}
    assert all(0 < s["documents_in_shards"] <= s["documents"] and s["tokens"] > 0 for s in sources.values())
    assert lineage["training"]["steps"] == 4 and lineage["training"]["tokens"] == 4 * 8 * 32
    assert sum(s["trained_tokens"] for s in sources.values()) == lineage["training"]["tokens"]
    assert all(s["trained_tokens"] > 0 for s in sources.values())
    metrics = lineage["metrics"]
    assert {"loss", "eval_loss"} <= set(metrics) and set(metrics["eval_loss_by_source"]) == {"code", "web"}
    assert lineage["taint"]["tainted"] is False
    card = (result.directory / "README.md").read_text()
    assert version.tag in card and ds.commit in card and "Rollback taint: none" in card
    assert all(stage["commit"] in card for stage in lineage["stages"])
    assert f"held-out eval loss, source code | {metrics['eval_loss_by_source']['code']:.4f}" in card
    assert "trained without biases" in card and "padded to a multiple of 64" in card


@pytest.mark.slow
@pytest.mark.parametrize("parallel, bias", [("ddp", False), ("fsdp", True)])
def test_a_two_process_run_exports_the_same_way(dataset, tmp_path, parallel, bias):
    ds, _ = dataset
    device, _ = device_for_ranks(2)
    model = ModelConfig.preset("tiny", bias=bias)
    cfg = config(ds, f"two-{parallel}", parallel=parallel, device=device, model=model)
    completed = torchrun(cfg, 2)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = export_checkpoint(f"two-{parallel}@4", tmp_path / "hf", repo_spec=str(ds.repo))
    assert (
        result.lineage["training"]["parallel"] == parallel and result.lineage["training"]["world_size"] == 2
    )
    tokenizer_json = LocalRepo(ds.repo).get(ds.commit, "tokenizer/tokenizer.json").decode()
    check_round_trip(result.directory, tokenizer_json, tokenlake_model(cfg, 4))


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = tokenlake(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_refusals_are_one_sentence_and_exit_2(tmp_path, capsys):
    ds, version = publish(tmp_path / "home")
    repo = LocalRepo(ds.repo)
    v2 = publish_tokenized_version(repo, "curate-2", seed=2)
    train(config(ds, "on-v2", commit=v2.commit_id, steps=2))
    train(config(ds, "moved", commit=v2.commit_id, steps=2))  # then resumed onto version 1
    train(config(ds, "moved", commit=ds.commit, steps=4, resume="allow-data-change"))
    repo_flag = ["--repo", str(ds.repo)]

    for args, expected in [
        (["nobody@2"], "no run named 'nobody'"),
        (["on-v2@3"], "run 'on-v2' has no checkpoint at step 3 (its checkpoints: steps 0, 2)"),
        (["on-v2"], "'on-v2' does not name a checkpoint: expected RUN@STEP"),
    ]:
        code, _, err = _cli(capsys, *repo_flag, "export", *args, "--to", str(tmp_path / "x"))
        assert code == 2 and expected in err and "\n" not in err, err
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    code, _, err = _cli(capsys, *repo_flag, "export", "on-v2@2", "--to", str(full))
    assert code == 2 and "exists and is not empty" in err and "\n" not in err
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    code, _, err = _cli(capsys, *repo_flag, "export", "on-v2@2", "--to", str(full / "keep.txt" / "hf"))
    assert code == 2 and "cannot be created" in err and "\n" not in err
    assert not (tmp_path / "x").exists()

    plan = plan_rollback(repo, version.tag)  # version 2 leaves main: what trained on it is tainted
    restored = restore_main(repo, plan, "rollback-flow")
    record = rollback_record(repo, plan, restored, "rollback-flow")
    mark_tainted(repo, find_tainted(repo, read_lineage(repo), record), record, "rollback-flow")
    for name in ["on-v2@2", "moved@4"]:  # moved@4 is bound to version 1, but its weights saw version 2
        code, _, err = _cli(capsys, *repo_flag, "export", name, "--to", str(tmp_path / "tainted"))
        assert code == 2 and f"checkpoint {name} is tainted" in err and restored.tag in err, err
        assert "--allow-tainted" in err and "\n" not in err
    assert not (tmp_path / "tainted").exists()
    assert not list(tmp_path.glob(".tmp-*"))

    code, out, _ = _cli(
        capsys,
        *repo_flag,
        "export",
        "on-v2@2",
        "--to",
        str(tmp_path / "tainted"),
        "--allow-tainted",
        "--json",
    )
    assert code == 0 and json.loads(out)["taint"]["tainted"] is True
    lineage = json.loads((tmp_path / "tainted" / "tokenlake_lineage.json").read_text())
    assert lineage["taint"]["tainted"] and lineage["taint"]["exported_with"] == "--allow-tainted"
    assert lineage["taint"]["reasons"][0]["rollback"] == restored.tag
    card = (tmp_path / "tainted" / "README.md").read_text()
    assert "TAINTED" in card and "--allow-tainted" in card and restored.tag in card
    moved = export_checkpoint("moved@4", tmp_path / "moved", repo_spec=str(ds.repo), allow_tainted=True)
    assert moved.lineage["training"]["data_changes"][0]["from"]["commit"] == v2.commit_id
    assert all(s["trained_tokens"] is None for s in moved.lineage["sources"])  # another plan before step 2
