# expect: L5
# why: the scorer calls int() on the raw answer, so it raises ValueError on empty or garbage text
# (but not on the reference's own text, so L2 passes).
# detail: scorer failed
"""Number of divisors of n (an equality oracle)."""

import random

from shared.environment import Environment


class CountDivisors(Environment):
    name = "count_divisors"
    description = "How many positive divisors a positive integer has."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(2, 50 * difficulty * difficulty)}

    def solve(self, instance: dict) -> int:
        n = instance["n"]
        return sum(1 for d in range(1, n + 1) if n % d == 0)

    def render(self, instance: dict) -> str:
        return (
            f"How many positive divisors does {instance['n']} have (1 and {instance['n']} "
            "included)?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if int(answer) == reference else 0.0  # bug: raises on non-numeric text
