"""Per-token log-probs of sampled tokens through the LM head, one chunk of tokens at a time, so
that a training step never holds the whole batch's logits (see `_HeadLogprobs`).
"""

from __future__ import annotations

from typing import Any

import torch

LOGIT_CHUNK = 256
"""Tokens whose logits are alive at once (256 x 152k x 4 bytes = 156 MB; two such tensors at
the most, a chunk's logits and a temporary of their size)."""


class _HeadLogprobs(torch.autograd.Function):
    """The LM head and the log-probs of the targets, chunk by chunk, with a backward pass that
    recomputes each chunk's logits.

    A causal LM's logits are the largest tensor of a training step: tokens x vocabulary (152k
    for Qwen) in float32, and autograd keeps a few copies of them. For a micro-batch of four
    1.5k-token generator completions that is ~3.7 GB per copy. Here the decoder's last hidden
    states at the completion positions go through the LM head in chunks of `chunk` tokens: the
    forward pass keeps only the per-token log-prob (and, for free, the entropy), and the
    backward pass recomputes each chunk's logits to form its gradient. Peak memory for the head
    is one chunk's logits, whatever the sequence length; the cost is one extra head matmul per
    token.

    log p(t) = z_t / T - logsumexp(z / T) with z = h W^T, so
    d log p / d z = (onehot(t) - softmax(z / T)) / T.

    The weight's gradient is added straight into `weight.grad` (made where None) by the
    backward pass, not returned: returned, it would be a second weight-sized tensor (0.54 GiB
    for the 0.5B model's 152k x 896 head in float32) that autograd holds through the whole
    backward pass until the tied input embeddings' gradient joins it, at the learner's peak
    (docs/results.md#learner-memory). So `loss.backward()` gives the weight its gradient;
    `torch.autograd.grad` would not see the head's part of it.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        inv_temp: torch.Tensor,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        count = hidden.shape[0]
        logprobs = torch.empty(count, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(count if with_entropy else 0, device=hidden.device)
        for first in range(0, count, chunk):
            rows = slice(first, first + chunk)
            logits = _chunk_logits(hidden[rows], weight, inv_temp[rows])
            lse = torch.logsumexp(logits, dim=-1)
            logprobs[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - lse
            if with_entropy:
                # H = -sum p log p = logsumexp(z) - sum p z, with p = exp(z - logsumexp(z))
                probs = logits.sub(lse[:, None]).exp_()
                entropy[rows] = lse - probs.mul_(logits).sum(dim=-1)
                del probs
            del logits  # before the next chunk's: one chunk's logits alive at a time
        ctx.save_for_backward(hidden, weight, targets, inv_temp)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: torch.Tensor, _grad_entropy: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None, None]:
        hidden, weight, targets, inv_temp = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = _grad_into(weight) if want_weight else None
        for first in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(first, first + ctx.chunk)
            logits = _chunk_logits(hidden[rows], weight, inv_temp[rows])
            upstream = grad_logprobs[rows, None].float()
            # the softmax in place of the logits (exp(z - logsumexp z)): one chunk-sized tensor
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            grad = logits.sub_(lse).exp_().mul_(-upstream)
            del logits
            grad.scatter_add_(-1, targets[rows, None], upstream)
            grad.mul_(inv_temp[rows, None])
            grad = grad.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.T.float(), hidden[rows].float())
            del grad  # before the next chunk's logits
        if grad_weight is not None and grad_weight is not weight.grad:
            weight.grad.add_(grad_weight.to(weight.dtype))  # type: ignore[union-attr]
        return grad_hidden, None, None, None, None, None


def _grad_into(weight: torch.Tensor) -> torch.Tensor:
    """Where the head's backward pass adds up the weight's gradient: `weight.grad` itself
    (made, zero, where None) when it is float32, else a float32 buffer added to it after."""
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    if weight.grad.dtype == torch.float32:
        return weight.grad
    return torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, inv_temp: torch.Tensor
) -> torch.Tensor:
    return (hidden @ weight.T).float().mul_(inv_temp[:, None])


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    *,
    chunk: int = LOGIT_CHUNK,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of `targets` [N] under softmax(hidden [N, H] @ weight [V, H]^T / temperature
    [N]) in float32, differentiable in `hidden` and `weight` (whose gradient `.backward()`
    adds to `weight.grad`: see `_HeadLogprobs`); and the entropy of each distribution (not
    differentiable; empty unless `with_entropy`)."""
    inv_temp = temperature.to(device=hidden.device, dtype=torch.float32).reciprocal()
    result: tuple[torch.Tensor, torch.Tensor] = _HeadLogprobs.apply(
        hidden, weight, targets, inv_temp, chunk, with_entropy
    )
    return result
