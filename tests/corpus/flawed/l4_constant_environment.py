# expect: L4
# why: a constant environment: the sampler ignores rng and difficulty, so every instance,
# prompt and reference is the same.
# trigger: difficulty
# detail: distinct reference
"""The 10th Fibonacci number (an "environment" with a single instance)."""

import random
import re

from shared.environment import Environment


class TenthFibonacci(Environment):
    name = "tenth_fibonacci"
    description = "The 10th Fibonacci number."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"index": 10}

    def solve(self, instance: dict) -> int:
        a, b = 0, 1
        for _ in range(instance["index"]):
            a, b = b, a + b
        return a

    def render(self, instance: dict) -> str:
        return (
            f"With F(0) = 0 and F(1) = 1, what is the Fibonacci number F({instance['index']})?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
