# expect: L2
# why: the scorer returns a percentage (100.0 for a correct answer), outside [0, 1]; L2 scores the
# reference answer and gets 100.0.
# detail: outside [0, 1]
"""Least common multiple of two integers (an equality oracle)."""

import math
import random
import re

from shared.environment import Environment


class LeastCommonMultiple(Environment):
    name = "least_common_multiple"
    description = "The least common multiple of two positive integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        high = 10 * difficulty * difficulty
        return {"a": rng.randint(2, high), "b": rng.randint(2, high)}

    def solve(self, instance: dict) -> int:
        return math.lcm(instance["a"], instance["b"])

    def render(self, instance: dict) -> str:
        return (
            f"What is the least common multiple of {instance['a']} and {instance['b']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,9})\s*", answer)
        return 100.0 if match is not None and int(match.group(1)) == reference else 0.0
