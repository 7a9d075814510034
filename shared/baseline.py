"""The best constant answer: what a policy that ignores the problem would score.

A pass rate means little alone: on an environment whose answers are mostly the same text, a
policy that always writes that text passes often. Pure: the workers' `constant_baseline` job
scores the `candidates` in the sandbox, and `best_constant` picks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_CANDIDATES", "Constant", "best_constant", "candidates"]

MAX_CANDIDATES = 32
"""Most candidate texts scored on a feasibility environment: each costs one scorer call per
instance, all in the same sandbox ops."""


@dataclass(frozen=True, slots=True)
class Constant:
    """The best constant answer on some instances, and how it fared on each."""

    answer: str
    score: float
    """Share of the instances it passes (reward exactly 1.0)."""
    rewards: tuple[float, ...]
    """Per instance, in the order given: its reward."""

    def non_modal(self, seeds: Sequence[int]) -> list[int]:
        """The seeds (given in the instances' order) of the instances it does not pass."""
        return [seed for seed, reward in zip(seeds, self.rewards, strict=True) if reward != 1.0]


def _by_frequency(texts: Sequence[str]) -> list[str]:
    """Distinct texts, most frequent first; equally frequent ones in lexicographic order."""
    counts = Counter(texts)
    return sorted(counts, key=lambda text: (-counts[text], text))


def candidates(
    oracle: str,
    references: Sequence[str],
    answers: Sequence[str] = (),
    cap: int = MAX_CANDIDATES,
) -> list[str]:
    """The texts worth scoring as a constant, in order of preference.

    equality: the one most frequent reference text (ties: the lexicographically smallest),
    since an equality scorer accepts little besides the reference. feasibility: any text may
    satisfy many instances, so the distinct texts among `references` and `answers` (the
    policy's), counted together, the `cap` most frequent."""
    if oracle == "equality":
        return _by_frequency(references)[:1]
    if oracle == "feasibility":
        return _by_frequency([*references, *answers])[:cap]
    raise ValueError(f"unknown oracle {oracle!r}: expected equality or feasibility")


def best_constant(texts: Sequence[str], rewards: Sequence[Sequence[float]]) -> Constant | None:
    """The text of `texts` that passes the most instances, and that share; None when there is
    no text. A pass is a reward of exactly 1.0, as the held-out evaluation counts it; the
    *non-modal* instances are those the best constant does not pass (`Constant.non_modal`).

    `rewards[i][k]` is the reward of `texts[k]` on instance i. Among texts passing equally
    many, the earliest in `texts` wins (for `candidates`' order: the most frequent)."""
    if not texts:
        return None
    if any(len(row) != len(texts) for row in rewards):
        raise ValueError(f"every instance needs one reward per text ({len(texts)})")
    passes = [[row[k] == 1.0 for row in rewards] for k in range(len(texts))]
    best = max(range(len(texts)), key=lambda k: (sum(passes[k]), -k))
    score = sum(passes[best]) / len(rewards) if rewards else 0.0
    return Constant(texts[best], score, tuple(float(row[best]) for row in rewards))
