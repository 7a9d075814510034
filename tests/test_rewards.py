"""The generator's reward table (docs/CONTRACT.md#the-generators-reward), with Q, B and gamma
computed by hand."""

from __future__ import annotations

import math

import pytest

from shared.config import AdmissionSettings
from shared.rewards import (
    FAILURE_STAGES,
    STAGES,
    RepetitionTracker,
    gamma_for,
    generator_reward,
    mean_pairwise_similarity,
    novelty_bonus,
    quality,
)

S = AdmissionSettings()

# Q = exp(-(a - 0.3)^2 / (2 x 0.2^2)) = exp(-(a - 0.3)^2 / 0.08)
Q_AT_0 = 0.32465246735834974  # exp(-0.09 / 0.08) = exp(-1.125)
Q_AT_1 = 0.0021874911181828873  # exp(-0.49 / 0.08) = exp(-6.125)
Q_AT_05 = 0.6065306597126333  # exp(-0.04 / 0.08) = exp(-0.5)
Q_AT_025 = 0.9692332344763441  # exp(-0.0025 / 0.08) = exp(-0.03125)


def test_quality_peaks_at_target_and_is_computed_at_the_ends() -> None:
    assert quality(0.3, S) == 1.0
    assert quality(0.0, S) == pytest.approx(Q_AT_0, abs=1e-12)
    assert quality(1.0, S) == pytest.approx(Q_AT_1, abs=1e-12)
    assert quality(0.5, S) == pytest.approx(Q_AT_05, abs=1e-12)
    assert quality(0.25, S) == pytest.approx(Q_AT_025, abs=1e-12)
    assert math.isclose(Q_AT_0, math.exp(-1.125))


def test_novelty_bonus_fades_across_the_band() -> None:
    # B = 0.1 x gamma x clip((0.65 - s) / 0.20, 0, 1)
    assert novelty_bonus(0.30, 2.0, S) == pytest.approx(0.2)  # below the band: full
    assert novelty_bonus(0.45, 2.0, S) == pytest.approx(0.2)
    assert novelty_bonus(0.50, 2.0, S) == pytest.approx(0.15)  # 0.1 x 2 x 0.75
    assert novelty_bonus(0.55, 5.0, S) == pytest.approx(0.25)  # 0.1 x 5 x 0.5
    assert novelty_bonus(0.65, 5.0, S) == 0.0
    assert novelty_bonus(0.90, 5.0, S) == 0.0  # above the band: none


def test_gamma_bounds() -> None:
    assert gamma_for(None, S) == 2.0  # no history yet: the low end
    assert gamma_for(0.0, S) == 2.0
    assert gamma_for(0.3, S) == 2.0
    assert gamma_for(0.5, S) == pytest.approx(3.5)
    assert gamma_for(0.7, S) == pytest.approx(5.0)
    assert gamma_for(1.0, S) == 5.0
    for r in (x / 100 for x in range(101)):
        assert 2.0 <= gamma_for(r, S) <= 5.0
    assert gamma_for(0.4, S) <= gamma_for(0.6, S)  # more repetition, larger gamma


def test_repetition_tracker_means_over_the_window() -> None:
    assert mean_pairwise_similarity([[1.0, 0.2, 0.4], [0.2, 1.0, 0.6], [0.4, 0.6, 1.0]]) == (
        pytest.approx(0.4)
    )
    assert mean_pairwise_similarity([[1.0]]) is None
    with pytest.raises(ValueError):
        mean_pairwise_similarity([[1.0, 0.5], [0.5]])

    tracker = RepetitionTracker(window=2)
    assert tracker.repetitiveness is None and tracker.gamma(S) == 2.0
    assert tracker.add_group([[1.0, 0.4], [0.4, 1.0]]) == pytest.approx(0.4)
    assert tracker.add_group([[1.0]]) is None  # a lone candidate does not count
    tracker.add(0.6)
    assert tracker.repetitiveness == pytest.approx(0.5)
    assert tracker.gamma(S) == pytest.approx(3.5)
    tracker.add(0.8)  # 0.4 falls out of the window of 2
    assert tracker.values == pytest.approx([0.6, 0.8])
    assert tracker.gamma(S) == pytest.approx(5.0)
    assert RepetitionTracker(2, tracker.values).repetitiveness == pytest.approx(0.7)


def test_repetitiveness_sums_the_window_newest_first() -> None:
    """The order the workers' window has always been summed in (its last bit decides gamma's)."""
    assert (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1
    assert RepetitionTracker(3, [0.1, 0.2, 0.3]).repetitiveness == ((0.3 + 0.2) + 0.1) / 3


def test_group_rewards_match_the_table() -> None:
    tracker = RepetitionTracker(S.repetition_window, [0.4, 0.6])
    gamma = tracker.gamma(S)
    assert gamma == pytest.approx(3.5)  # repetitiveness 0.5: halfway from 2 to 5

    # (stages failed, calibration pass rate, novelty similarity) -> (expected reward, case)
    group: list[tuple[set[str], float | None, float | None, float, str]] = [
        ({"L1"}, None, None, -1.0, "L1"),
        ({"L2"}, None, None, -0.9, "L2"),
        ({"L3"}, 0.3, 0.1, -0.8, "L3"),  # figures are ignored below L5
        ({"L4"}, None, None, -0.7, "L4"),
        ({"L5"}, 0.3, 0.1, -0.5, "L5"),
        # a copy earns the L5 figure, whatever review and calibration said
        ({"novelty"}, 0.3, 1.0, -0.5, "too similar"),
        (set(), 0.3, 0.80, -0.5, "too similar"),  # at the gate (an in-group copy)
        ({"review", "calibration"}, 0.0, 0.95, -0.5, "too similar"),
        # passed L1-L5, calibration outside 0 < a < 1: 1 + Q, no B
        ({"calibration"}, 0.0, 0.5, 1.0 + Q_AT_0, "calibration"),
        ({"calibration", "review"}, 1.0, 0.3, 1.0 + Q_AT_1, "calibration"),
        # new and calibrated: 1 + Q + B, whatever review said
        ({"review"}, 0.3, 0.3, 1.0 + 1.0 + 0.35, "new"),  # B = 0.1 x 3.5 x 1
        (set(), 0.25, 0.55, 1.0 + Q_AT_025 + 0.175, "new"),  # B = 0.1 x 3.5 x 0.5
        (set(), 0.5, 0.79, 1.0 + Q_AT_05 + 0.0, "new"),  # just below the gate: no bonus
    ]
    for failed, a, s, expected, case in group:
        parts = generator_reward(failed, a, s, gamma, S)
        assert parts.total == pytest.approx(expected, abs=1e-12), (failed, a, s)
        assert parts.case == case, (failed, a, s)
        first = [stage for stage in STAGES if stage in failed]
        assert parts.failed_stage == (first[0] if first else None)
        if case in ("L1", "L2", "L3", "L4", "L5", "too similar"):
            assert parts.quality is None and parts.bonus is None and parts.total == parts.base
        else:
            assert parts.base == 1.0
            assert parts.total == pytest.approx(1.0 + (parts.quality or 0) + (parts.bonus or 0))
    totals = [generator_reward(f, a, s, gamma, S).total for f, a, s, _, _ in group]
    assert totals[:5] == sorted(totals[:5])  # graded: each later stage above the one before
    assert max(totals[:8]) < min(totals[8:])  # every failure and copy below any valid file


def test_review_verdicts_never_change_a_reward() -> None:
    for failed, a, s in [
        (set(), 0.25, 0.3),
        ({"calibration"}, 0.0, 0.3),
        ({"novelty"}, 0.25, 1.0),
        (set(), 0.25, 0.9),
    ]:
        assert generator_reward(failed | {"review"}, a, s, 2.0, S).total == (
            generator_reward(failed, a, s, 2.0, S).total
        )


def test_missing_figures_add_nothing_and_unknown_stages_raise() -> None:
    parts = generator_reward({"calibration"}, None, 0.3, 2.0, S)
    assert parts.quality is None and parts.bonus is None and parts.total == pytest.approx(1.0)
    parts = generator_reward((), None, 0.3, 2.0, S)
    assert parts.quality is None and parts.bonus == pytest.approx(0.2)
    assert parts.total == pytest.approx(1.2)
    parts = generator_reward((), 0.3, None, 2.0, S)
    assert parts.bonus is None and parts.gamma is None and parts.total == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown stage"):
        generator_reward({"L6"}, None, None, 2.0, S)


def test_coefficients_are_settings() -> None:
    custom = AdmissionSettings(
        reward_fail_l1=-2.0,
        reward_fail_l2=-1.5,
        reward_fail_l3=-1.25,
        reward_fail_l4=-1.1,
        reward_fail_scorer=-0.25,
        reward_pass=0.5,
        bonus_scale=0.2,
    )
    figures = [generator_reward({s}, None, None, 2.0, custom).total for s in FAILURE_STAGES]
    assert figures == [-2.0, -1.5, -1.25, -1.1, -0.25]
    assert generator_reward({"novelty"}, 0.3, 1.0, 2.0, custom).total == -0.25
    # 0.5 + Q(0.3) + 0.2 x 2 x 1
    assert generator_reward((), 0.3, 0.0, 2.0, custom).total == pytest.approx(1.9)
