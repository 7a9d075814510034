# expect: L2
# why: the description holds no visible character: a Braille blank, a Hangul filler, zero-width
# and other format characters (Unicode category Cf) and spaces only.
# detail: description
# trigger: none
"""Sum of the digits of a number (an equality oracle)."""

import random
import re

from shared.environment import Environment


class DigitSum(Environment):
    name = "digit_sum"
    description = "\u2800\u3164 \u200b\u2060\u2063\ufeff\u00ad\u202e\u115f\uffa0\u3000"
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(10, 10 ** (2 + difficulty))}

    def solve(self, instance: dict) -> int:
        return sum(int(digit) for digit in str(instance["number"]))

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the decimal digits of {instance['number']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
