"""The serving-difficulty search: the level whose solver pass rate is nearest the target.

`DifficultySearch` is the pure step-by-step form, which the orchestrator drives between its
measurements; `search_serving_difficulty` drives it with a synchronous measuring function.
Where it fits: docs/DESIGN.md#solver-groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SearchResult:
    level: int
    """The level to serve at."""
    curve: dict[int, float] = field(default_factory=dict)
    """Every measured level and its pass rate, in the order measured."""


class DifficultySearch:
    """Bisection over [low, high] from `start`, at most `rounds` measurements.

    Loop: `level = search.next_level()`; if None, stop; measure; `search.report(level, rate)`.

    After admission, the orchestrator looks for the difficulty at which the current solver
    passes about a* = 0.3 of the instances, and serves the environment there (the admission
    gate and the generator's reward keep using the fixed calibration difficulty). Higher levels
    are assumed harder, so the pass rate is taken to fall as the level rises: a level that is
    too easy (rate above the target) sends the search up, one too hard sends it down. The
    search starts at the calibration difficulty; each measurement is one pass rate over m
    fresh instances, measured by the caller. It ends early when a level hits the target
    exactly or the bracket is empty; it then answers the measured level whose rate is nearest
    the target (ties: see `nearest`).

    A bracket of n levels is emptied in floor(log2 n) + 1 measurements: four for levels 1-10
    starting from the middle, so with that many rounds the answer is the true nearest level of
    a monotone curve. With fewer, it is the nearest of those measured. Measured rates are noisy
    and need not be monotone: the search still terminates within the budget and answers the
    nearest measured level.

    The asyncio orchestrator measures between steps (`ServingSearch.search_one`, one round = m
    fresh instances graded through the usual Celery chain) and records the result in the pool.
    """

    def __init__(self, low: int, high: int, start: int, *, target: float, rounds: int) -> None:
        if low > high:
            raise ValueError(f"empty difficulty range [{low}, {high}]")
        if not low <= start <= high:
            raise ValueError(f"start level {start} is outside [{low}, {high}]")
        if rounds < 0:
            raise ValueError(f"rounds must be 0 or more, got {rounds}")
        self.start = start
        self.target = target
        self.rounds = rounds
        self.curve: dict[int, float] = {}
        self._low = low  # the unmeasured bracket still worth measuring
        self._high = high
        self._next: int | None = start
        self._done = rounds == 0

    def next_level(self) -> int | None:
        """The level to measure next, or None when the search is over."""
        if self._done or len(self.curve) >= self.rounds or self._low > self._high:
            return None
        return self._next

    def report(self, level: int, rate: float) -> None:
        """Record the pass rate measured at `level` (the one `next_level` gave)."""
        if level != self._next:
            raise ValueError(f"expected a rate for level {self._next}, got one for {level}")
        self.curve[level] = rate
        if rate == self.target:
            self._done = True
            return
        if rate > self.target:  # too easy: go harder
            self._low = level + 1
        else:  # too hard: go easier
            self._high = level - 1
        self._next = (self._low + self._high) // 2

    def result(self) -> SearchResult:
        """The measured level nearest the target (the start level when nothing was measured)."""
        if not self.curve:
            return SearchResult(self.start, {})
        return SearchResult(nearest(self.curve, self.target), dict(self.curve))


def nearest(curve: dict[int, float], target: float) -> int:
    """The level of `curve` whose rate is nearest `target`.

    Ties go towards the crossing: among levels all too easy the hardest, among levels all too
    hard the easiest, and between one of each the easier.
    """

    def key(level: int) -> tuple[float, int]:
        rate = curve[level]
        return (abs(rate - target), -level if rate > target else level)

    return min(curve, key=key)


def search_serving_difficulty(
    pass_rate: Callable[[int], float],
    low: int,
    high: int,
    start: int,
    *,
    target: float = 0.3,
    rounds: int = 3,
) -> SearchResult:
    """Run the search with `pass_rate(level)` measuring the solver at a level (m instances)."""
    search = DifficultySearch(low, high, start, target=target, rounds=rounds)
    while (level := search.next_level()) is not None:
        search.report(level, pass_rate(level))
    return search.result()
