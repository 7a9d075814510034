# expect: L1
# why: the scorer routine `score` is missing (it is misnamed `grade`).
# detail: score
"""Number of inversions in a list (an equality oracle: counting pairs)."""

import random
import re

from shared.environment import Environment


class CountInversions(Environment):
    name = "count_inversions"
    description = "How many pairs of positions in a list are out of order."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": rng.sample(range(1, 100), 3 + 2 * difficulty)}

    def solve(self, instance: dict) -> int:
        numbers = instance["numbers"]
        return sum(
            1 for i in range(len(numbers)) for j in range(i + 1, len(numbers))
            if numbers[i] > numbers[j]
        )

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"Consider the list {numbers}. An inversion is a pair of positions i < j whose "
            "values are in decreasing order. How many inversions does the list have?\n"
            "Give the answer as a single integer."
        )

    def grade(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
