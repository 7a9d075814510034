"""GRPO math on hand-computed examples (evoenv_learner/grpo.py).

Advantages use the population std of the group's valid rewards: A_i = (r_i - mean) / std.
"""

from __future__ import annotations

import math

import pytest
import torch

from evoenv_learner.grpo import (
    group_advantages,
    grpo_loss,
    role_token_weights,
    token_entropy,
    token_logprobs,
)
from shared.config import GrpoSettings

SETTINGS = GrpoSettings()  # generator_advantage_scale 0.3, clip 0.2 / 0.28


def approx(values: torch.Tensor | None, expected: list[float], tol: float = 1e-5) -> bool:
    assert values is not None
    return values.tolist() == pytest.approx(expected, abs=tol)


# ------------------------------------------------------------------------------ advantages


def test_solver_advantages_one_correct_of_four() -> None:
    # rewards 1, 0, 0, 0: mean 0.25; variance (0.75^2 + 3 x 0.25^2) / 4 = 0.1875;
    # std = sqrt(0.1875) = 0.4330127; A = 0.75 / 0.4330127 = 1.7320508 (= sqrt 3) and
    # -0.25 / 0.4330127 = -0.5773503 (= -1 / sqrt 3).
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0], "solver", SETTINGS)
    assert approx(advantages, [1.7320508, -0.5773503, -0.5773503, -0.5773503])
    assert advantages is not None and advantages.dtype == torch.float32


def test_solver_advantages_two_of_four() -> None:
    # rewards 1, 1, 0, 0: mean 0.5, std 0.5: A = +1, +1, -1, -1.
    assert approx(group_advantages([1.0, 0.0, 1.0, 0.0], "solver", SETTINGS), [1, -1, 1, -1])


def test_generator_advantages_scaled_by_0_3() -> None:
    # generator rewards -1 (fails L1-L4), -0.5 (fails L5), 1.5 and 2.0 (pass, with Q + B):
    # mean 0.5; deviations -1.5, -1, 1, 1.5; variance (2.25 + 1 + 1 + 2.25) / 4 = 1.625;
    # std = 1.2747549; normalised -1.1766968, -0.7844645, 0.7844645, 1.1766968;
    # times 0.3: -0.3530090, -0.2353394, 0.2353394, 0.3530090.
    rewards: list[float | None] = [-1.0, -0.5, 1.5, 2.0]
    solver = group_advantages(rewards, "solver", SETTINGS)
    generator = group_advantages(rewards, "generator", SETTINGS)
    assert approx(solver, [-1.1766968, -0.7844645, 0.7844645, 1.1766968])
    assert approx(generator, [-0.3530090, -0.2353394, 0.2353394, 0.3530090])
    # the scale is the setting's, not a constant
    half = group_advantages(rewards, "generator", GrpoSettings(generator_advantage_scale=0.5))
    assert approx(half, [-0.5883484, -0.3922323, 0.3922323, 0.5883484])


def test_env_error_members_get_zero_and_change_nothing() -> None:
    # the env_error member (None) enters neither mean nor std: the others keep the advantages
    # of the group without it (sqrt 3, -1/sqrt 3), and it gets 0.
    with_error = group_advantages([1.0, None, 0.0, 0.0, 0.0], "solver", SETTINGS)
    assert approx(with_error, [1.7320508, 0.0, -0.5773503, -0.5773503, -0.5773503])


@pytest.mark.parametrize(
    "rewards",
    [
        [1.0, 1.0, 1.0, 1.0],  # all correct
        [0.0, 0.0, 0.0, 0.0],  # all wrong
        [0.0, None, 0.0, None],  # the valid ones agree
        [1.0, None, None, None],  # one valid reward
        [None, None, None, None],  # all env_error
    ],
)
def test_zero_variance_groups_are_skipped(rewards: list[float | None]) -> None:
    assert group_advantages(rewards, "solver", SETTINGS) is None
    assert group_advantages(rewards, "generator", SETTINGS) is None


# -------------------------------------------------------------------------------- log-probs


def test_token_logprobs_and_entropy() -> None:
    # logits (0, ln 3) -> probabilities (1/4, 3/4); the target is token 1: log 0.75.
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    assert token_logprobs(logits, torch.tensor([[0]])).item() == pytest.approx(math.log(0.25))
    # entropy: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    assert token_entropy(logits).item() == pytest.approx(0.5623351, abs=1e-6)


# ---------------------------------------------------------------------------------- the loss

# Six tokens, ratios r and advantages A, band [0.8, 1.28]. Per token, loss = -min(rA, clip(r)A):
#   r=1.5 A=+1: min(1.5, 1.28)  = 1.28  -> -1.28, clipped (zero gradient)
#   r=0.5 A=-1: min(-0.5, -0.8) = -0.8  ->  0.8,  clipped (zero gradient)
#   r=1.1 A=+1: inside the band        -> -1.1,  d/dlogp = -A r = -1.1
#   r=0.7 A=+1: min(0.7, 0.8)   = 0.7   -> -0.7,  not clipped (below the band, pushed up): -0.7
#   r=1.5 A=-1: min(-1.5, -1.28)= -1.5  ->  1.5,  not clipped (above the band, pushed down): +1.5
#   r=0.7 A=-1: min(-0.7, -0.8) = -0.8  ->  0.8,  clipped (zero gradient)
# Sum 0.02, mean over 6 tokens 0.0033333; gradient of the mean: per-token derivative / 6.
# Clip fraction 3/6; mean ratio (1.5+0.5+1.1+0.7+1.5+0.7)/6 = 1.0.
RATIOS = [1.5, 0.5, 1.1, 0.7, 1.5, 0.7]
ADVANTAGES = [1.0, -1.0, 1.0, 1.0, -1.0, -1.0]
EXPECTED_GRAD = [0.0, 0.0, -1.1 / 6, -0.7 / 6, 1.5 / 6, 0.0]


def _tokens(ratios: list[float], old: float = -1.0) -> tuple[torch.Tensor, torch.Tensor]:
    old_logprobs = torch.full((1, len(ratios)), old)
    new_logprobs = (old_logprobs + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    return new_logprobs, old_logprobs


def test_clipped_loss_values_gradients_and_metrics() -> None:
    new, old = _tokens(RATIOS)
    advantages = torch.tensor([ADVANTAGES])  # per token, [1, 6]
    mask = torch.ones(1, 6, dtype=torch.bool)
    loss, metrics = grpo_loss(new, old, advantages, mask, 0.2, 0.28)
    assert loss.item() == pytest.approx(0.02 / 6, abs=1e-6)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx(EXPECTED_GRAD, abs=1e-6)
    assert metrics.tokens == 6
    assert metrics.clip_fraction == pytest.approx(0.5)
    assert metrics.ratio_mean == pytest.approx(1.0)
    assert metrics.kl == 0.0
    assert metrics.policy_loss == pytest.approx(0.02 / 6, abs=1e-6)


def test_on_policy_loss_is_minus_mean_advantage() -> None:
    # ratio 1 everywhere: loss = -(token mean of A). Two sequences, advantages +2 and -1
    # (one per sequence), of 3 and 1 valid tokens: -(3 x 2 + 1 x -1) / 4 = -1.25.
    new = torch.full((2, 3), -0.5, requires_grad=True)
    old = torch.full((2, 3), -0.5)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    loss, metrics = grpo_loss(new, old, torch.tensor([2.0, -1.0]), mask, 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.25)
    assert metrics.clip_fraction == 0.0
    assert metrics.ratio_mean == pytest.approx(1.0)
    loss.backward()
    # d/dlogp = -A r / 4 on valid tokens, 0 on masked ones
    assert new.grad is not None
    assert new.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, -0.5, 0.25, 0.0, 0.0])


def test_masked_tokens_change_nothing() -> None:
    # a 7th token with an extreme ratio and advantage, masked out: same loss and gradients
    new, old = _tokens([*RATIOS, 50.0])
    advantages = torch.tensor([[*ADVANTAGES, 100.0]])
    mask = torch.tensor([[True] * 6 + [False]])
    loss, metrics = grpo_loss(new, old, advantages, mask, 0.2, 0.28)
    loss.backward()
    assert loss.item() == pytest.approx(0.02 / 6, abs=1e-6)
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx([*EXPECTED_GRAD, 0.0], abs=1e-6)
    assert metrics.tokens == 6


def test_num_tokens_makes_micro_batches_add_up() -> None:
    # split the six tokens in two micro-batches of 4 and 2, each normalised by the batch's 6:
    # the losses and gradients add up to the whole batch's.
    new, old = _tokens(RATIOS)
    advantages = torch.tensor([ADVANTAGES])
    first, _ = grpo_loss(
        new[:, :4],
        old[:, :4],
        advantages[:, :4],
        torch.ones(1, 4, dtype=torch.bool),
        0.2,
        0.28,
        num_tokens=6,
    )
    second, _ = grpo_loss(
        new[:, 4:],
        old[:, 4:],
        advantages[:, 4:],
        torch.ones(1, 2, dtype=torch.bool),
        0.2,
        0.28,
        num_tokens=6,
    )
    (first + second).backward()
    assert (first + second).item() == pytest.approx(0.02 / 6, abs=1e-6)
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx(EXPECTED_GRAD, abs=1e-6)


def test_role_token_weights_make_each_role_a_token_mean_weighed_by_its_sequences() -> None:
    # 3 solver answers of 2, 2 and 4 tokens (8), 1 environment file of 40: the solver holds
    # 3/4 of the sequences, the generator 1/4, whatever their lengths.
    weights = role_token_weights(["solver", "solver", "generator", "solver"], [2, 2, 40, 4])
    assert weights == pytest.approx([0.75 / 8, 0.75 / 8, 0.25 / 40, 0.75 / 8])
    assert sum(w * n for w, n in zip(weights, [2, 2, 40, 4], strict=True)) == pytest.approx(1.0)
    longer = role_token_weights(["solver", "solver", "generator", "solver"], [2, 2, 80, 4])
    assert longer[2] * 80 == pytest.approx(weights[2] * 40)  # the generator's total: 1/4
    assert longer[0] == weights[0]
    # one role, or equal lengths: the plain token mean
    assert role_token_weights(["solver"] * 3, [1, 2, 5]) == pytest.approx([1 / 8] * 3)
    assert role_token_weights(["solver", "generator"], [5, 5]) == pytest.approx([0.1, 0.1])
    assert role_token_weights(["solver", "generator"], [4, 0]) == [0.25, 0.0]
    with pytest.raises(ValueError):
        role_token_weights(["solver"], [1, 2])


def test_token_weights_replace_the_token_count_and_micro_batches_add_up() -> None:
    # weights 1/6 on every token: the batch's token mean, in two micro-batches as in one
    new, old = _tokens(RATIOS)
    advantages = torch.tensor([ADVANTAGES])
    parts = [
        grpo_loss(
            new[:, span],
            old[:, span],
            advantages[:, span],
            torch.ones(1, span.stop - span.start, dtype=torch.bool),
            0.2,
            0.28,
            token_weights=torch.tensor([1 / 6]),
        )[0]
        for span in (slice(0, 4), slice(4, 6))
    ]
    (parts[0] + parts[1]).backward()
    assert (parts[0] + parts[1]).item() == pytest.approx(0.02 / 6, abs=1e-6)
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx(EXPECTED_GRAD, abs=1e-6)
    # two sequences weighed 0.5 / 3 and 0.5 / 1: on-policy, -(0.5 x 2 + 0.5 x -1) = -0.5
    two = torch.full((2, 3), -0.5, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    loss, _ = grpo_loss(
        two,
        two.detach(),
        torch.tensor([2.0, -1.0]),
        mask,
        0.2,
        0.28,
        token_weights=torch.tensor([0.5 / 3, 0.5]),
    )
    assert loss.item() == pytest.approx(-0.5)


def test_k3_kl_to_reference() -> None:
    # ref - new = ln 2 on both tokens: k3 = 2 - ln 2 - 1 = 0.3068528; with kl_coef 0.1 and
    # advantage 0, the loss is 0.1 x 0.3068528 = 0.0306853. d k3 / d new = 1 - exp(ref - new)
    # = -1, so the gradient is 0.1 x -1 / 2 tokens = -0.05 each.
    new = torch.tensor([[-2.0, -1.0]], requires_grad=True)
    ref = new.detach() + math.log(2.0)
    loss, metrics = grpo_loss(
        new,
        new.detach(),
        torch.tensor([0.0]),
        torch.ones(1, 2, dtype=torch.bool),
        0.2,
        0.28,
        0.1,
        ref,
    )
    assert metrics.kl == pytest.approx(0.3068528, abs=1e-6)
    assert loss.item() == pytest.approx(0.0306853, abs=1e-6)
    loss.backward()
    assert new.grad is not None
    assert new.grad.flatten().tolist() == pytest.approx([-0.05, -0.05], abs=1e-6)
