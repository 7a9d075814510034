"""Attack: spin forever in the scorer. Stopped by the per-operation wall-clock timeout."""

import random

from shared.environment import Environment


class CountUp(Environment):
    name = "count_up"
    description = "Report the number shown."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 9 * difficulty)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Write the number {instance['n']} as digits."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        total = 0
        while True:
            total += 1
