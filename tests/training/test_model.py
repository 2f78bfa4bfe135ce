"""The GPT model, its presets, the schedule and the config validation."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from training.config import MODEL_PRESETS, ModelConfig, OptimConfig, TrainConfig
from training.model import GPT, GPTConfig
from training.runstate import WarmupCosine


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, **overrides))


def test_logits_at_a_position_never_depend_on_later_tokens():
    model = tiny().eval()
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    logits, _ = model(idx)
    logits_changed, _ = model(changed)
    assert torch.equal(logits[:, :10], logits_changed[:, :10])
    assert not torch.equal(logits[:, 10:], logits_changed[:, 10:])


def test_output_head_is_tied_to_the_token_embedding_and_loss_is_cross_entropy():
    model = tiny()
    assert model.lm_head.weight is model.wte.weight
    idx = torch.randint(0, 64, (3, 16))
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
    assert torch.allclose(loss, expected)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.1)  # near uniform at init


def test_parameter_count_and_flop_formula_of_gpt2_small():
    model = GPT(ModelConfig.preset("gpt2-124m").gpt_config(vocab_size=50257, seq_len=1024))
    assert model.config.vocab_size == 50304  # padded to a multiple of 64
    n = model.num_params()  # without the position embedding, the tied head counted once
    assert (
        n == 12 * (12 * 768 * 768 + 2 * 768) + 768 + 50304 * 768
    )  # blocks (LayerNorms have no bias), ln_f, wte
    assert model.flops_per_token(1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_weight_decay_applies_to_matrices_only():
    model = tiny(bias=True)
    decayed, plain = model.optimizer_groups(0.1)
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_warmup_then_cosine_to_the_floor():
    schedule = WarmupCosine(OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4), steps=14)
    lrs = [schedule.lr(s) for s in range(16)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and lrs[9] == pytest.approx(0.55) and lrs[14] == lrs[15] == 0.1
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))


def test_configs_are_validated_where_built():
    assert set(MODEL_PRESETS) >= {"tiny", "gpt2-124m"}
    with pytest.raises(ValidationError, match="multiple of micro_batch"):
        TrainConfig(run="r", commit="c", global_batch=10, micro_batch=4)
    with pytest.raises(ValidationError, match="run name"):
        TrainConfig(run="../escape", commit="c")
    with pytest.raises(ValidationError, match="n_head"):
        ModelConfig(n_embd=30, n_head=4)
    with pytest.raises(ValidationError, match="min_lr"):
        OptimConfig(lr=1e-4, min_lr=1e-3)
    with pytest.raises(ValidationError):
        TrainConfig(run="r", commit="c", unknown_field=1)
    with pytest.raises(ValueError, match="processes"):
        TrainConfig(run="r", commit="c", global_batch=8, micro_batch=4).accumulation_steps(4)
    assert TrainConfig(run="r", commit="c", global_batch=8, micro_batch=2).accumulation_steps(2) == 2


@pytest.mark.parametrize(("preset", "millions"), [("gpt2-124m", 124), ("gpt2-350m", 355), ("gpt2-774m", 774)])
def test_gpt2_presets_have_the_sizes_of_their_names(preset, millions):
    with torch.device("meta"):  # shapes only
        model = GPT(ModelConfig.preset(preset).gpt_config(vocab_size=50257, seq_len=1024))
    # GPT-2 had biases and a 50257-token head; without biases and with the padded head the count
    # lands within 1% of the published size
    assert model.num_params(non_embedding=False) == pytest.approx(millions * 1e6, rel=0.01)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_where_there_is_none_is_refused_in_one_sentence():
    from training.distributed import use_cuda

    assert use_cuda("auto") is False and use_cuda("cpu") is False
    with pytest.raises(RuntimeError, match="no CUDA device here; use device 'auto' or 'cpu'"):
        use_cuda("cuda")
