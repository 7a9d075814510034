"""The generator's reward (docs/CONTRACT.md#the-generators-reward): pure functions, no I/O.

`generator_reward` makes one candidate's reward from the stages it failed and its figures: a
penalty graded by how far it got (L1-L5), the L5 figure for a copy, else `reward_pass` + Q
(`quality`), + B (`novelty_bonus`, gamma from `RepetitionTracker`) when calibrated.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from shared.config import AdmissionSettings

FAILURE_STAGES = ("L1", "L2", "L3", "L4", "L5")
"""Failing one of these earns its own figure (`reward_fail_l1` ... `reward_fail_scorer`)."""
MODEL_STAGES = ("review", "calibration", "novelty")
"""Stages run once L1-L5 pass; all three run, so a candidate may fail several of them."""
STAGES = (*FAILURE_STAGES, *MODEL_STAGES)

RewardCase = Literal["L1", "L2", "L3", "L4", "L5", "too similar", "calibration", "new"]
"""The case of the reward table that paid a reward: the L1-L5 stage it failed, a copy (too
similar), passed L1-L5 but calibration outside 0 < a < 1, or passed and calibrated."""


class RewardParts(BaseModel):
    """One candidate's generator reward and how it was made up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    total: float
    """The reward the generator is trained with."""
    base: float
    """The table's entry for its case."""
    quality: float | None = None
    """Q; None for a failure or a copy, or when calibration produced no pass rate."""
    bonus: float | None = None
    """B; None unless the candidate is new and calibrated and novelty produced a similarity."""
    gamma: float | None = None
    """The gamma B was computed with (None when B was not)."""
    failed_stage: str | None = None
    """The first stage the candidate failed (None: every stage passed)."""
    case: RewardCase | None = None
    """The case of the table that paid it (None: recorded before the cases were named)."""


def quality(a: float, settings: AdmissionSettings) -> float:
    """Q = exp(-(a - a*)^2 / (2 w^2)): 1.0 at the target pass rate, smaller away from it.

    Computed even when a is 0 or 1: that bars admission but still tells the generator how far
    off it was."""
    width = settings.quality_width
    return math.exp(-((a - settings.target_pass_rate) ** 2) / (2.0 * width * width))


def novelty_bonus(s: float, gamma: float, settings: AdmissionSettings) -> float:
    """B = scale x gamma x clip((high - s) / (high - low), 0, 1): full below the band, 0 above."""
    low, high = settings.bonus_band
    fade = _clip((high - s) / (high - low), 0.0, 1.0)
    return settings.bonus_scale * gamma * fade


def gamma_for(repetitiveness: float | None, settings: AdmissionSettings) -> float:
    """gamma, linear in repetitiveness across `repetition_range`, clipped to `gamma_range`.

    With no history yet (None) gamma is the low end of its range.
    """
    g_low, g_high = settings.gamma_range
    if repetitiveness is None:
        return g_low
    r_low, r_high = settings.repetition_range
    if r_high == r_low:
        position = 0.0 if repetitiveness < r_low else 1.0
    else:
        position = _clip((repetitiveness - r_low) / (r_high - r_low), 0.0, 1.0)
    return g_low + (g_high - g_low) * position


def generator_reward(
    failed: Collection[str],
    pass_rate: float | None,
    similarity: float | None,
    gamma: float,
    settings: AdmissionSettings,
) -> RewardParts:
    """The generator's reward of one candidate from `failed`, every stage it failed (L1-L5
    stop at the first failure; review, calibration and novelty all run once L1-L5 pass), its
    calibration pass rate and its novelty similarity s (the larger of pool and in-group).

    The table (docs/CONTRACT.md#the-generators-reward), first match wins:

    - failed L1, L2, L3, L4 or L5: that stage's figure, graded by how far the file got;
    - too similar (failed novelty, or s at the gate or above): the L5 figure, no Q, no B,
      whatever review and calibration said;
    - failed calibration: `reward_pass` + Q;
    - else: `reward_pass` + Q + B.

    Review verdicts never enter it. A figure that is None (calibration or novelty lost to an
    infrastructure failure) adds nothing; the parts record it as None. Raises ValueError for a
    stage name the contract does not know.
    """
    unknown = sorted(set(failed) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage {unknown[0]!r}; expected some of {', '.join(STAGES)}")
    first = next((stage for stage in STAGES if stage in failed), None)
    for stage in FAILURE_STAGES:
        if stage in failed:
            figure = _failure_figure(stage, settings)
            return RewardParts(total=figure, base=figure, failed_stage=first, case=stage)
    if "novelty" in failed or (similarity is not None and similarity >= settings.novelty_gate):
        figure = settings.reward_fail_scorer
        return RewardParts(total=figure, base=figure, failed_stage=first, case="too similar")
    q = None if pass_rate is None else quality(pass_rate, settings)
    base = settings.reward_pass
    if "calibration" in failed:
        return RewardParts(
            total=base + (q or 0.0), base=base, quality=q, failed_stage=first, case="calibration"
        )
    b = None if similarity is None else novelty_bonus(similarity, gamma, settings)
    return RewardParts(
        total=base + (q or 0.0) + (b or 0.0),
        base=base,
        quality=q,
        bonus=b,
        gamma=None if b is None else gamma,
        failed_stage=first,
        case="new",
    )


def _failure_figure(stage: str, settings: AdmissionSettings) -> float:
    """The reward of a candidate whose first failure is `stage` (one of L1-L5)."""
    return {
        "L1": settings.reward_fail_l1,
        "L2": settings.reward_fail_l2,
        "L3": settings.reward_fail_l3,
        "L4": settings.reward_fail_l4,
        "L5": settings.reward_fail_scorer,
    }[stage]


SOLVER_BOUNDS = (0.0, 1.0)
"""A solver reward is a score in [0, 1] (docs/CONTRACT.md#grades)."""


def generator_bounds(settings: AdmissionSettings) -> tuple[float, float]:
    """The lowest and highest reward `generator_reward` can pay with `settings`: from the lowest
    failure figure to `reward_pass` + the largest Q (1) + the largest B (gamma at the top of its
    range), with a hair of slack for float rounding."""
    failures = [_failure_figure(stage, settings) for stage in FAILURE_STAGES]
    bonuses = [0.0, *(settings.bonus_scale * gamma for gamma in settings.gamma_range)]
    low = min(*failures, settings.reward_pass + min(bonuses))
    high = max(*failures, settings.reward_pass + 1.0 + max(bonuses))
    slack = 1e-9 * max(1.0, abs(low), abs(high))
    return low - slack, high + slack


def mean_pairwise_similarity(matrix: Sequence[Sequence[float]]) -> float | None:
    """Mean of the similarities between distinct candidates of one group.

    `matrix[i][j]` is the similarity of candidates i and j (symmetric; the diagonal is
    ignored, and only i < j is read). None for a group of fewer than two candidates.
    """
    n = len(matrix)
    if n < 2:
        return None
    for row in matrix:
        if len(row) != n:
            raise ValueError(
                f"the similarity matrix must be square, got a row of {len(row)} in {n}"
            )
    pairs = [matrix[i][j] for i in range(n) for j in range(i + 1, n)]
    return sum(pairs) / len(pairs)


class RepetitionTracker:
    """Repetitiveness of recent generation groups: the running mean, over the last `window`
    groups, of each group's mean pairwise similarity. Its `values` are the state to checkpoint.
    """

    def __init__(self, window: int, values: Iterable[float] = ()) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._values: deque[float] = deque(values, maxlen=window)

    @property
    def values(self) -> list[float]:
        """The per-group means in the window, oldest first."""
        return list(self._values)

    def add(self, group_mean: float) -> None:
        """Record one group's mean pairwise similarity."""
        self._values.append(group_mean)

    def add_group(self, matrix: Sequence[Sequence[float]]) -> float | None:
        """Record one group from its similarity matrix; a group of fewer than two counts not."""
        mean = mean_pairwise_similarity(matrix)
        if mean is not None:
            self.add(mean)
        return mean

    @property
    def repetitiveness(self) -> float | None:
        """The mean over the window; None before the first group. Summed newest first, the
        order the workers' window (a Redis list) has always been summed in: the last bit of a
        float sum depends on the order, and gamma and the rewards with it."""
        if not self._values:
            return None
        return sum(reversed(self._values)) / len(self._values)

    def gamma(self, settings: AdmissionSettings) -> float:
        """gamma for the current repetitiveness (the low end before the first group)."""
        return gamma_for(self.repetitiveness, settings)


def _clip(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)
