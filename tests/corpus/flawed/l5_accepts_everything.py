# expect: L5
# why: the scorer never looks at the answer: a leftover stub that returns 1.0 for anything.
# detail: accepts the
"""Number of trailing zeros of n factorial (an equality oracle)."""

import random

from shared.environment import Environment


class FactorialTrailingZeros(Environment):
    name = "factorial_trailing_zeros"
    description = "How many zeros n! ends with."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(5, 25 * 10 ** (difficulty // 2))}

    def solve(self, instance: dict) -> int:
        n, zeros = instance["n"], 0
        while n:
            n //= 5
            zeros += n
        return zeros

    def render(self, instance: dict) -> str:
        return (
            f"How many zeros does {instance['n']}! (the factorial) end with in decimal?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0  # TODO: compare with the reference
