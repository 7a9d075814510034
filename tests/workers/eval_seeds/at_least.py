"""Write a whole number at least as large as a given one (a feasibility oracle)."""

import random

from shared.environment import Environment


class AtLeast(Environment):
    name = "at_least"
    description = "Write a whole number at least as large as a given one."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 3

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 9 * difficulty)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Write a whole number that is at least {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        text = answer.strip()
        return 1.0 if text.isdigit() and int(text) >= instance["n"] else 0.0
