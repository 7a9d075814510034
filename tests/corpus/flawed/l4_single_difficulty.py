# expect: L4
# why: min_difficulty equals max_difficulty, so difficulty cannot matter.
# trigger: none
# detail: difficulty must matter
"""Sum of the digits of a 12-digit number (an equality oracle with one fixed difficulty)."""

import random
import re

from shared.environment import Environment


class TwelveDigitSum(Environment):
    name = "twelve_digit_sum"
    description = "The sum of the digits of a 12-digit number."
    oracle = "equality"
    min_difficulty = 5
    max_difficulty = 5

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(10 ** 11, 10 ** 12 - 1)}

    def solve(self, instance: dict) -> int:
        return sum(int(d) for d in str(instance["number"]))

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the digits of {instance['number']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
