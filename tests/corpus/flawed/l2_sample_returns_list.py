# expect: L2
# why: sample returns the list itself instead of a dict holding it.
# detail: sample
"""Smallest gap between two values of a list (an equality oracle)."""

import random
import re

from shared.environment import Environment


class SmallestGap(Environment):
    name = "smallest_gap"
    description = "The smallest difference between two values of a list of distinct integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> list:
        return rng.sample(range(1, 100 * difficulty), 3 + 2 * difficulty)

    def solve(self, instance: list) -> int:
        values = sorted(instance)
        return min(b - a for a, b in zip(values, values[1:]))

    def render(self, instance: list) -> str:
        numbers = ", ".join(str(n) for n in instance)
        return (
            f"What is the smallest difference between two of these numbers: {numbers}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: list, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
