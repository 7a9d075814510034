# expect: L1
# why: two classes derive from Environment: a base with the routines and a subclass of it.
# detail: exactly one class
"""Sum of a list of integers, split into a base class and a tweaked subclass."""

import random
import re

from shared.environment import Environment


class ListSumBase(Environment):
    name = "list_sum_base"
    description = "The sum of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(-50, 50) for _ in range(3 + 2 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return sum(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the sum of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([+-]?[0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0


class ListSum(ListSumBase):
    name = "list_sum"
    description = "The sum of a list of integers, some of them negative."
