"""Say whether a number is even or odd (an equality oracle whose scorer ignores case)."""

import random

from shared.environment import Environment


class Parity(Environment):
    name = "parity"
    description = "Say whether a number is even or odd."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 3

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 10**difficulty)}

    def solve(self, instance: dict) -> str:
        return "even" if instance["n"] % 2 == 0 else "odd"

    def render(self, instance: dict) -> str:
        return f"Is {instance['n']} even or odd? Answer with one word: even or odd."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip().lower() == reference else 0.0
