# expect: L5
# why: the scorer returns 1.0 for the right answer but falls off the end (None) otherwise, which
# is not a number in [0, 1].
# detail: scorer failed
"""Sum of the two largest digits of a number (an equality oracle)."""

import random
import re

from shared.environment import Environment


class SumOfTwoLargestDigits(Environment):
    name = "sum_of_two_largest_digits"
    description = "The sum of the two largest digits of a positive integer."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(10 ** difficulty, 10 ** (difficulty + 1) - 1)}

    def solve(self, instance: dict) -> int:
        digits = sorted(int(d) for d in str(instance["number"]))
        return digits[-1] + digits[-2]

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the two largest digits of {instance['number']}? (If the largest "
            "digit occurs twice, both count.)\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*", answer)
        if match is not None and int(match.group(1)) == reference:
            return 1.0
