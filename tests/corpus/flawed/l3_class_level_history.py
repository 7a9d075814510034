# expect: L3
# why: a class-level list shared across calls: the sampler appends to it and numbers its puzzles by
# its length, so an instance differs alone and inside a batch.
# detail: alone
"""Sum of the squares of a list (an equality oracle)."""

import random
import re

from shared.environment import Environment


class SumOfSquares(Environment):
    name = "sum_of_squares"
    description = "The sum of the squares of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    history: list = []  # bug: mutable class-level state, mutated by sample

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        numbers = [rng.randint(-9 * difficulty, 9 * difficulty) for _ in range(2 + difficulty)]
        self.history.append(numbers)
        return {"puzzle": len(self.history), "numbers": numbers}

    def solve(self, instance: dict) -> int:
        return sum(n * n for n in instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"Puzzle #{instance['puzzle']}: what is the sum of the squares of {numbers}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,7})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
