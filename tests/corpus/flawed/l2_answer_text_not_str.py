# expect: L2
# why: answer_text returns the int itself instead of a string.
# detail: answer_text
"""Integer square root (an equality oracle)."""

import math
import random
import re

from shared.environment import Environment


class IntegerSquareRoot(Environment):
    name = "integer_square_root"
    description = "The largest integer whose square does not exceed n."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(2, 10 ** (1 + difficulty))}

    def solve(self, instance: dict) -> int:
        return math.isqrt(instance["n"])

    def render(self, instance: dict) -> str:
        return (
            f"What is the largest integer whose square is at most {instance['n']}?\n"
            "Give the answer as a single integer."
        )

    def answer_text(self, reference: int) -> int:
        return reference

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,8})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
