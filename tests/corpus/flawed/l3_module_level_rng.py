# expect: L3
# why: the sampler draws from a module-level random.Random instead of the rng it is given; that
# generator's state carries across calls, so an instance differs alone and inside a batch.
# detail: alone
"""Median of an odd-length list (an equality oracle)."""

import random
import re

from shared.environment import Environment

_SHUFFLER = random.Random(12345)  # bug: module-level state used across calls


class OddMedian(Environment):
    name = "odd_median"
    description = "The median of an odd-length list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        numbers = [rng.randint(1, 50 * difficulty) for _ in range(1 + 2 * difficulty)]
        _SHUFFLER.shuffle(numbers)
        return {"numbers": numbers}

    def solve(self, instance: dict) -> int:
        numbers = sorted(instance["numbers"])
        return numbers[len(numbers) // 2]

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"What is the median of {numbers}? (The list has an odd number of elements.)\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
