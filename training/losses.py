"""Next-token cross-entropy over the output head, chunk by chunk, without the full logits.

The plain loss materialises the logits of every token (``[tokens, vocab]``: 16 x 1024 x
50304 in bf16 is 1.6 GB for GPT-2 124M at micro-batch 16), then an fp32 copy for the
softmax (3.3 GB), then gradients of the same size. Here the head's matmul, the softmax and
the gradient are done for ``chunk_tokens`` tokens at a time: the forward pass also computes
the gradients with respect to the hidden states and the head's weight (the loss is a sum
over tokens, so each chunk's share of the gradient is final once its softmax is known), and
keeps only those. The backward pass then scales them by the incoming gradient. The matmul
work is the same as the plain loss's (logits, then the two gradient products); only one
chunk of logits exists at a time.

Liger-Kernel's fused linear cross-entropy uses the same idea; this version keeps to PyTorch
operations so that it runs wherever the model runs, CPU included.
"""

from __future__ import annotations

import torch


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run the head's matmul in (the hidden states' own outside autocast)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, compute_dtype: torch.dtype):
        tokens = hidden.size(0)
        want_hidden_grad, want_weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        hidden_grad = torch.empty_like(hidden) if want_hidden_grad else None
        weight_grad = torch.zeros_like(weight, dtype=torch.float32) if want_weight_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes below are explicit
            head = weight.to(compute_dtype)
            for start in range(0, tokens, chunk_tokens):
                chunk = hidden[start : start + chunk_tokens].to(compute_dtype)
                target = targets[start : start + chunk_tokens]
                logits = (chunk @ head.t()).float()
                log_norm = torch.logsumexp(logits, dim=-1)
                total += (log_norm - logits.gather(1, target[:, None]).squeeze(1)).sum()
                if not (want_hidden_grad or want_weight_grad):
                    continue
                # d(mean loss)/d(logits) = (softmax - one_hot(target)) / tokens, in place over the logits
                grad = logits.sub_(log_norm[:, None]).exp_()
                grad[torch.arange(grad.size(0), device=grad.device), target] -= 1.0
                grad = grad.div_(tokens).to(compute_dtype)
                if want_hidden_grad:
                    hidden_grad[start : start + chunk_tokens] = (grad @ head).to(hidden.dtype)
                if want_weight_grad:
                    weight_grad += (grad.t() @ chunk).float()
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(hidden_grad, weight_grad)
        return total / tokens

    @staticmethod
    def backward(ctx, grad_output):
        hidden_grad, weight_grad = ctx.saved_tensors
        grad_hidden = hidden_grad * grad_output if hidden_grad is not None else None
        grad_weight = (weight_grad * grad_output).to(ctx.weight_dtype) if weight_grad is not None else None
        return grad_hidden, grad_weight, None, None, None


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, ``chunk_tokens`` rows at a time.

    ``hidden`` is ``[..., n_embd]``, ``weight`` ``[vocab, n_embd]``, ``targets`` the matching
    ``[...]`` token ids. Under autocast the matmuls run in the autocast dtype and the softmax
    in fp32, as the plain loss does."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    return _ChunkedLinearCrossEntropy.apply(
        flat_hidden, weight, targets.reshape(-1), chunk_tokens, _compute_dtype(flat_hidden)
    )
