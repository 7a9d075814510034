"""Role-conditioned GRPO as pure tensor functions (docs/DESIGN.md#trainer): group advantages,
per-role token weights, token log-probs and the clipped loss. Nothing here touches a model, a
device or the settings object beyond reading numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from shared.config import GrpoSettings

Role = Literal["solver", "generator"]

ADVANTAGE_EPS = 1e-6
"""Added to the group's std before dividing."""
MIN_REWARD_STD = 1e-6
"""A group whose rewards' std is below this has no variance: it is skipped."""
MAX_LOG_RATIO = 20.0
"""Log importance ratios are clamped to +-this before exp (a -inf behaviour log-prob)."""


def valid_mask(rewards: Sequence[float | None]) -> torch.Tensor:
    """True for the members that have a reward (not `env_error`)."""
    return torch.tensor([reward is not None for reward in rewards], dtype=torch.bool)


def group_advantages(
    rewards: Sequence[float | None],
    role: Role,
    settings: GrpoSettings,
    *,
    eps: float = ADVANTAGE_EPS,
) -> torch.Tensor | None:
    """One advantage per member (float32, shape [G]; 0 for `env_error` members), or None when
    the group has no reward variance among its valid members and must be skipped.

    A_i = (r_i - mean(r)) / (std(r) + eps) over the group's valid rewards (population std),
    times `generator_advantage_scale` for a generator group. An `env_error` member (reward
    None) is masked out of the loss and never enters the mean or the std. Fewer than two valid
    rewards carry no signal either: None.
    """
    valid = [float(reward) for reward in rewards if reward is not None]
    if len(valid) < 2:
        return None
    values = torch.tensor(valid, dtype=torch.float64)
    mean = values.mean()
    std = values.std(correction=0)
    if float(std) < MIN_REWARD_STD:
        return None
    normalised = (values - mean) / (std + eps)
    if role == "generator":
        normalised = normalised * settings.generator_advantage_scale
    advantages = torch.zeros(len(rewards), dtype=torch.float64)
    advantages[valid_mask(rewards)] = normalised
    return advantages.to(torch.float32)


def role_token_weights(roles: Sequence[Role], lengths: Sequence[int]) -> list[float]:
    """What each completion token of each sequence weighs in a step's loss: each role's loss
    is the mean over its own tokens, and the roles are combined by their share of the step's
    sequences. Sequence i of role r (n_r of the N sequences, T_r tokens) gets

        w_i = (n_r / N) / T_r

    so the weights of all tokens add up to 1, a role's weight does not move with its
    completions' lengths (a 1,200-token environment file and a 120-token answer push alike,
    as their advantages say), and a step of one role, or of equal lengths, is the plain
    token mean. Sequences without tokens weigh nothing."""
    if len(roles) != len(lengths):
        raise ValueError(f"{len(roles)} roles for {len(lengths)} lengths")
    sequences: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for role, length in zip(roles, lengths, strict=True):
        if length > 0:
            sequences[role] = sequences.get(role, 0) + 1
            tokens[role] = tokens.get(role, 0) + length
    total = sum(sequences.values())
    return [
        (sequences[role] / total) / tokens[role] if length > 0 else 0.0
        for role, length in zip(roles, lengths, strict=True)
    ]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] at every position: logits [..., V], targets [...] -> [...].
    The logits are already divided by the temperature.

    Computed in float32 as gather minus logsumexp, which never materialises a second
    vocabulary-sized tensor beside the logits.
    """
    logits = logits.float()
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution at every position: logits [..., V] -> [...] (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@dataclass(frozen=True, slots=True)
class LossMetrics:
    """Figures of one `grpo_loss` call, each a mean over its `tokens` valid tokens."""

    tokens: int
    clip_fraction: float
    """Share of tokens whose clipped term was chosen (their gradient is zero)."""
    ratio_mean: float
    """Mean importance ratio new/behaviour."""
    kl: float
    """Mean k3 estimate of KL(new || reference); 0 without a reference."""
    policy_loss: float
    """Token-mean of the clipped surrogate alone (without the KL term)."""


def grpo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    *,
    num_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """The clipped-surrogate loss, to be minimised: token-level clipped importance ratios
    against the behaviour log-probs (PPO with DAPO's clip-higher), averaged over the batch's
    valid tokens (every token weighs the same, whatever its sequence's length), plus an
    optional k3 estimate of the KL to a reference policy.

    Shapes: `new_logprobs`, `old_logprobs`, `mask` (and `ref_logprobs`) are [B, T];
    `advantages` is [B] (one per sequence) or [B, T]. Per token, with r = exp(new - old):

        loss_t = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef k3_t
        k3_t   = exp(ref - new) - (ref - new) - 1

    summed over the tokens where `mask` is true and divided by `num_tokens` (default: the
    number of such tokens). Under gradient accumulation pass the whole batch's token count as
    `num_tokens`, so the micro-batch losses add up to the batch's token mean. `token_weights`
    ([B] or [B, T], what each token weighs: `role_token_weights` of the whole batch)
    replaces that division: the weighted sum, whose micro-batch parts add up as well.
    """
    mask_f = mask.to(new_logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(new_logprobs.dtype)
    tokens = int(mask.sum().item())
    denominator = float(num_tokens) if num_tokens is not None else float(max(tokens, 1))
    if token_weights is not None:
        weights = token_weights.to(new_logprobs.dtype)
        mask_w = mask_f * (weights.unsqueeze(-1) if weights.dim() == 1 else weights)
        denominator = 1.0
    else:
        mask_w = mask_f

    log_ratio = torch.clamp(new_logprobs - old_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    unclipped_term = ratio * advantages
    clipped_term = clipped_ratio * advantages
    per_token = -torch.minimum(unclipped_term, clipped_term)
    policy_loss = (per_token * mask_w).sum() / denominator

    kl_mean = 0.0
    loss = policy_loss
    if ref_logprobs is not None:
        delta = torch.clamp(ref_logprobs - new_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
        k3 = torch.exp(delta) - delta - 1.0
        loss = loss + kl_coef * (k3 * mask_w).sum() / denominator
        kl_mean = _masked_mean(k3, mask_f, tokens)

    with torch.no_grad():
        clipped = (clipped_term < unclipped_term).to(mask_f.dtype)
        metrics = LossMetrics(
            tokens=tokens,
            clip_fraction=_masked_mean(clipped, mask_f, tokens),
            ratio_mean=_masked_mean(ratio, mask_f, tokens),
            kl=kl_mean,
            policy_loss=float((per_token * mask_f).sum().item()) / max(tokens, 1),
        )
    return loss, metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, tokens: int) -> float:
    return float((values.detach() * mask).sum().item()) / max(tokens, 1)
