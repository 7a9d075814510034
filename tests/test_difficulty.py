"""The serving-difficulty search on synthetic monotone pass-rate curves."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from evoenv_learner.difficulty import DifficultySearch, nearest, search_serving_difficulty

TARGET = 0.3


def logistic(midpoint: float, slope: float) -> Callable[[int], float]:
    """A pass rate falling from ~1 to ~0 around `midpoint`."""
    return lambda level: 1.0 / (1.0 + math.exp(slope * (level - midpoint)))


def step(last_easy: int, easy: float = 0.9, hard: float = 0.05) -> Callable[[int], float]:
    return lambda level: easy if level <= last_easy else hard


def true_nearest(curve: Callable[[int], float], low: int, high: int) -> int:
    """The nearest level over the whole range (the same tie rule as the search)."""
    return nearest({level: curve(level) for level in range(low, high + 1)}, TARGET)


def counted(curve: Callable[[int], float]) -> tuple[Callable[[int], float], list[int]]:
    calls: list[int] = []

    def measure(level: int) -> float:
        calls.append(level)
        return curve(level)

    return measure, calls


CURVES = [logistic(m / 2, k) for m in range(-2, 24) for k in (0.5, 1.0, 2.0, 4.0)] + [
    step(last) for last in range(0, 11)
]


@pytest.mark.parametrize("index", range(len(CURVES)))
def test_finds_the_nearest_level_within_four_rounds_from_the_middle(index: int) -> None:
    curve = CURVES[index]
    measure, calls = counted(curve)
    result = search_serving_difficulty(measure, 1, 10, 5, target=TARGET, rounds=4)
    assert len(calls) <= 4 and len(set(calls)) == len(calls)
    assert result.level == true_nearest(curve, 1, 10)
    assert result.curve == {level: curve(level) for level in calls}


@pytest.mark.parametrize("start", range(1, 11))
def test_any_start_within_five_rounds(start: int) -> None:
    for curve in CURVES:
        measure, calls = counted(curve)
        result = search_serving_difficulty(measure, 1, 10, start, target=TARGET, rounds=5)
        assert len(calls) <= 5
        assert result.level == true_nearest(curve, 1, 10)


def test_wide_range_in_logarithmic_rounds() -> None:
    for mid in (3.3, 17.6, 42.2, 77.9, 99.1):
        curve = logistic(mid, 0.7)
        measure, calls = counted(curve)
        result = search_serving_difficulty(measure, 1, 100, 50, target=TARGET, rounds=8)
        assert len(calls) <= 8  # floor(log2 100) + 1 = 7, one more for an off-middle start
        assert result.level == true_nearest(curve, 1, 100)


def test_small_budget_answers_the_nearest_measured_level() -> None:
    curve = logistic(8.2, 1.0)
    measure, calls = counted(curve)
    result = search_serving_difficulty(measure, 1, 10, 5, target=TARGET, rounds=2)
    assert calls == [5, 8]
    assert result.level == min(calls, key=lambda lv: abs(curve(lv) - TARGET))
    assert result.level != true_nearest(curve, 1, 10)  # 2 rounds cannot reach level 8's neighbour


def test_stops_at_an_exact_hit_and_at_zero_rounds() -> None:
    measure, calls = counted(lambda level: 0.3 if level == 5 else 0.0)
    assert search_serving_difficulty(measure, 1, 10, 5, rounds=3).level == 5
    assert calls == [5]
    measure, calls = counted(step(3))
    result = search_serving_difficulty(measure, 1, 10, 5, rounds=0)
    assert (result.level, result.curve, calls) == (5, {}, [])


def test_stepwise_form_and_input_checks() -> None:
    search = DifficultySearch(1, 3, 2, target=TARGET, rounds=5)
    assert search.next_level() == 2
    with pytest.raises(ValueError):
        search.report(3, 0.5)
    search.report(2, 0.6)  # too easy: go harder
    assert search.next_level() == 3
    search.report(3, 0.1)
    assert search.next_level() is None  # bracket empty after 2 of 5 rounds
    assert search.result().level == 3  # |0.1 - 0.3| < |0.6 - 0.3|
    with pytest.raises(ValueError):
        DifficultySearch(5, 1, 3, target=TARGET, rounds=3)
    with pytest.raises(ValueError):
        DifficultySearch(1, 10, 11, target=TARGET, rounds=3)
