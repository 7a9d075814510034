"""Double a number (an equality oracle): a small sound environment for the queue tests."""

import random

from shared.environment import Environment


class Doubling(Environment):
    name = "doubling"
    description = "Double a number."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 6

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(10 ** (difficulty - 1), 10**difficulty)}

    def solve(self, instance: dict) -> int:
        return 2 * instance["n"]

    def render(self, instance: dict) -> str:
        return f"What is twice {instance['n']}? Answer with the number."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if answer.strip() == str(reference) else 0.0
