"""The generator's reward table (docs/DESIGN.md#the-generators-reward), with Q, B and gamma
computed by hand."""

from __future__ import annotations

import math

import pytest

from shared.config import AdmissionSettings
from shared.rewards import (
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

    # (failed stage, calibration pass rate, novelty similarity) -> expected reward
    group = [
        ("L1", None, None, -1.0),
        ("L2", None, None, -1.0),
        ("L3", 0.3, 0.1, -1.0),  # figures are ignored below L5
        ("L4", None, None, -1.0),
        ("L5", 0.3, 0.1, -0.5),
        # passes L1-L5: 1 + Q + B whatever review, calibration or novelty decide
        ("review", 0.3, 0.3, 1.0 + 1.0 + 0.35),  # B = 0.1 x 3.5 x 1
        ("calibration", 0.0, 0.5, 1.0 + Q_AT_0 + 0.2625),  # a = 0: not admitted, Q still paid
        ("calibration", 1.0, 0.5, 1.0 + Q_AT_1 + 0.2625),  # B = 0.1 x 3.5 x 0.75
        ("novelty", 0.5, 0.85, 1.0 + Q_AT_05 + 0.0),  # near-copy: no bonus
        (None, 0.25, 0.55, 1.0 + Q_AT_025 + 0.175),  # admitted; B = 0.1 x 3.5 x 0.5
    ]
    for stage, a, s, expected in group:
        parts = generator_reward(stage, a, s, gamma, S)
        assert parts.total == pytest.approx(expected, abs=1e-12), (stage, a, s)
        assert parts.failed_stage == stage
        if stage in ("L1", "L2", "L3", "L4", "L5"):
            assert parts.quality is None and parts.bonus is None and parts.total == parts.base
        else:
            assert parts.base == 1.0
            assert parts.total == pytest.approx(1.0 + (parts.quality or 0) + (parts.bonus or 0))


def test_missing_figures_add_nothing_and_unknown_stages_raise() -> None:
    parts = generator_reward("calibration", None, 0.3, 2.0, S)
    assert parts.quality is None and parts.bonus == pytest.approx(0.2)
    assert parts.total == pytest.approx(1.2)
    parts = generator_reward(None, 0.3, None, 2.0, S)
    assert parts.bonus is None and parts.gamma is None and parts.total == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown stage"):
        generator_reward("L6", None, None, 2.0, S)


def test_coefficients_are_settings() -> None:
    custom = AdmissionSettings(
        reward_fail_static=-2.0, reward_fail_scorer=-0.25, reward_pass=0.5, bonus_scale=0.2
    )
    assert generator_reward("L2", None, None, 2.0, custom).total == -2.0
    assert generator_reward("L5", None, None, 2.0, custom).total == -0.25
    # 0.5 + Q(0.3) + 0.2 x 2 x 1
    assert generator_reward(None, 0.3, 0.0, 2.0, custom).total == pytest.approx(1.9)
