"""The chunked LM-head log-probs equal the whole-logits computation, values and gradients."""

from __future__ import annotations

import pytest
import torch

from evoenv_learner.grpo import token_entropy, token_logprobs
from evoenv_learner.logprobs import head_logprobs


def _reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ weight.T).float() / temps[:, None]
    return token_logprobs(logits, targets), token_entropy(logits.detach())


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_head_matches_whole_logits(chunk: int) -> None:
    torch.manual_seed(0)
    tokens, width, vocab = 13, 16, 50
    hidden = torch.randn(tokens, width, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, width, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    temps = torch.tensor([0.7] * 6 + [1.0] * 7)
    upstream = torch.randn(tokens)

    mine, entropy = head_logprobs(hidden, weight, targets, temps, chunk=chunk, with_entropy=True)
    (mine * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()  # type: ignore[union-attr]
    hidden.grad = weight.grad = None

    expected, expected_entropy = _reference(hidden, weight, targets, temps)
    (expected * upstream).sum().backward()
    torch.testing.assert_close(mine, expected.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy, expected_entropy.float(), rtol=1e-4, atol=1e-5)
    # the logits are float32 inside both: agreement to float32 precision
    torch.testing.assert_close(grads[0], hidden.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, rtol=1e-4, atol=1e-5)


def test_no_entropy_unless_asked_and_no_grad_where_not_needed() -> None:
    hidden = torch.randn(4, 3)
    weight = torch.randn(7, 3, requires_grad=True)
    logprobs, entropy = head_logprobs(hidden, weight, torch.tensor([0, 1, 2, 3]), torch.ones(4))
    assert entropy.numel() == 0
    logprobs.sum().backward()
    assert weight.grad is not None and hidden.grad is None
    assert (logprobs <= 0).all()


def test_the_weights_gradient_adds_to_the_one_it_has() -> None:
    """Micro-batches accumulate: the head's part goes into `weight.grad`, onto what is there,
    and the input embeddings' part (a tied weight) is added to it."""
    torch.manual_seed(0)
    hidden = torch.randn(5, 4)
    weight = torch.randn(9, 4, requires_grad=True)
    ids = torch.tensor([1, 2, 3])
    targets, temps = torch.tensor([0, 3, 5, 8, 2]), torch.ones(5)

    def loss(chunked: bool) -> torch.Tensor:
        head = head_logprobs if chunked else lambda *a: _reference(*a)
        return head(hidden, weight, targets, temps)[0].sum() + weight[ids].square().sum()

    loss(False).backward()
    expected = weight.grad.clone()  # type: ignore[union-attr]
    weight.grad = torch.ones_like(weight)
    loss(True).backward()
    torch.testing.assert_close(weight.grad, expected + 1, rtol=1e-5, atol=1e-6)
