"""The chunked cross-entropy against the plain loss over the full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.losses import chunked_cross_entropy
from training.model import GPT, GPTConfig


def plain_loss(hidden, weight, targets):
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float().reshape(-1, weight.size(0)), targets.reshape(-1))


def inputs(seed: int = 0, tokens: tuple[int, int] = (3, 37), width: int = 48, vocab: int = 200):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*tokens, width, generator=generator, requires_grad=True)
    weight = (0.2 * torch.randn(vocab, width, generator=generator)).requires_grad_()
    targets = torch.randint(0, vocab, tokens, generator=generator)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 16, 50, 111, 4096])  # 111 = all tokens; 50 leaves a short last chunk
def test_loss_and_gradients_match_the_plain_loss_in_fp32(chunk):
    hidden, weight, targets = inputs()
    expected = plain_loss(hidden, weight, targets)
    expected.backward()
    hidden_grad, weight_grad = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    loss = chunked_cross_entropy(hidden, weight, targets, chunk)
    (2.5 * loss).backward()  # a scaled upstream gradient, as gradient accumulation gives
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(hidden.grad, 2.5 * hidden_grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(weight.grad, 2.5 * weight_grad, rtol=1e-5, atol=1e-7)


def test_under_bf16_autocast_it_stays_as_close_to_fp32_as_the_plain_loss():
    hidden, weight, targets = inputs(seed=1)
    exact = plain_loss(hidden.double(), weight.double(), targets).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = plain_loss(hidden, weight, targets).item()
        chunked = chunked_cross_entropy(hidden, weight, targets, 32)
    assert chunked.dtype == torch.float32
    assert abs(chunked.item() - exact) <= 2 * abs(plain - exact) + 1e-3
    chunked.backward()
    plain_hidden, plain_weight = hidden.grad.clone(), weight.grad.clone()
    assert plain_weight.dtype == torch.float32  # the parameter's dtype, as autocast's backward gives
    hidden.grad = weight.grad = None
    plain_loss(hidden.double(), weight.double(), targets).backward()
    torch.testing.assert_close(plain_hidden, hidden.grad.float(), rtol=0.05, atol=2e-4)
    torch.testing.assert_close(plain_weight, weight.grad.float(), rtol=0.05, atol=2e-4)


def test_without_gradients_it_is_the_same_loss():
    hidden, weight, targets = inputs(seed=2)
    with torch.no_grad():
        assert chunked_cross_entropy(hidden, weight, targets, 7).item() == pytest.approx(
            plain_loss(hidden, weight, targets).item(), rel=1e-6
        )


def test_the_model_with_a_chunked_loss_trains_like_the_plain_one():
    config = dict(vocab_size=128, block_size=16, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**config))
    chunked = GPT(GPTConfig(**config, loss_chunk_tokens=24))
    chunked.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 128, (4, 17))
    logits, expected = plain(idx[:, :-1], idx[:, 1:])
    none, loss = chunked(idx[:, :-1], idx[:, 1:])
    assert logits.shape == (4, 16, 128) and none is None  # the chunked model never forms the logits
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    expected.backward()
    loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), chunked.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_a_chunk_size_below_one_is_refused():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_cross_entropy(hidden, weight, targets, 0)
