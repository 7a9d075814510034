# expect: admitted
# odd but sound: a helper dataclass and helper functions beside the class, an __init__ that
# precomputes an immutable table, module-level constants, and `from __future__ import annotations`.
"""Count the primes in an interval (an equality oracle: a sieve)."""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass
from typing import Any

from shared.environment import Environment

LIMIT = 10_000
INTEGER = re.compile(r"\s*([0-9]{1,7})\s*\.?\s*")


@dataclass(frozen=True)
class Interval:
    low: int
    high: int

    def describe(self) -> str:
        return f"from {self.low} to {self.high}, both included"


def _sieve(limit: int) -> tuple[int, ...]:
    composite = bytearray(limit + 1)
    primes = []
    for number in range(2, limit + 1):
        if not composite[number]:
            primes.append(number)
            composite[number * number :: number] = b"\x01" * len(range(number * number, limit + 1, number))
    return tuple(primes)


class PrimesInInterval(Environment):
    name = "primes_in_interval"
    description = "How many prime numbers lie in a closed interval of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def __init__(self) -> None:
        self.primes = _sieve(LIMIT)  # read-only after construction

    def sample(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        # Difficulty 1: 21 consecutive integers, all at most 100. Difficulty 10: 2,001 integers,
        # all at most 10,000 (LIMIT).
        width = 20 * difficulty * difficulty
        low = rng.randint(2, 80 * difficulty * difficulty)
        return {"low": low, "high": low + width}

    def solve(self, instance: dict[str, Any]) -> int:
        interval = Interval(instance["low"], instance["high"])
        left = bisect.bisect_left(self.primes, interval.low)
        right = bisect.bisect_right(self.primes, interval.high)
        return right - left

    def render(self, instance: dict[str, Any]) -> str:
        interval = Interval(instance["low"], instance["high"])
        return (
            f"How many prime numbers are there among the integers {interval.describe()}?\n"
            "(A prime is an integer greater than 1 whose only positive divisors are 1 and "
            "itself.)\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict[str, Any], reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
