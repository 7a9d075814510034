# expect: L2
# why: at the highest difficulty the prompt ends with a lone surrogate (U+D800), which is no
# UTF-8 text: the solver could never be shown it.
# detail: UTF-8
# trigger: seed difficulty=10
"""Sum of the digits of a number (an equality oracle)."""

import random
import re

from shared.environment import Environment


class DigitSum(Environment):
    name = "digit_sum"
    description = "The sum of the decimal digits of a number."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(10, 10 ** (2 + difficulty))}

    def solve(self, instance: dict) -> int:
        return sum(int(digit) for digit in str(instance["number"]))

    def render(self, instance: dict) -> str:
        tail = " \ud800" if len(str(instance["number"])) > 8 else ""
        return (
            f"What is the sum of the decimal digits of {instance['number']}?\n"
            f"Give the answer as a single integer.{tail}"
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
