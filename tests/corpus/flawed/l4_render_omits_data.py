# expect: L4
# why: the prompt never shows the instance's numbers, so every prompt is the same (while the
# references vary).
# detail: distinct prompt
# trigger: difficulty
"""Parity of a sum (an equality oracle whose renderer forgets the data)."""

import random
import re

from shared.environment import Environment


class SumParity(Environment):
    name = "sum_parity"
    description = "Whether the sum of a list of integers is even or odd."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 99) for _ in range(3 + 2 * difficulty)]}

    def solve(self, instance: dict) -> str:
        return "even" if sum(instance["numbers"]) % 2 == 0 else "odd"

    def render(self, instance: dict) -> str:
        return (
            "Add up the numbers of the list. Is the sum even or odd?\n"
            "Write the final answer as one word: even or odd."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if re.sub(r"[^a-z]", "", answer.lower()) == reference else 0.0
