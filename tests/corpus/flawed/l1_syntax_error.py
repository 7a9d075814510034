# expect: L1
# why: a syntax error (the colon after the `def sample(...)` signature is missing).
# detail: syntax error
"""Sum of the digits of a number (an equality oracle)."""

import random
import re

from shared.environment import Environment


class DigitSum(Environment):
    name = "digit_sum"
    description = "The sum of the decimal digits of a positive integer."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict
        return {"number": rng.randint(10 ** difficulty, 10 ** (difficulty + 1) - 1)}

    def solve(self, instance: dict) -> int:
        return sum(int(digit) for digit in str(instance["number"]))

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the decimal digits of {instance['number']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
