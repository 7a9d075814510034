# expect: L1
# why: two independent classes derive from Environment in one file.
# detail: exactly one class
"""Minimum and maximum of a list, as two environments in one file."""

import random
import re

from shared.environment import Environment


def _parse(answer: str) -> int | None:
    match = re.fullmatch(r"\s*([+-]?[0-9]{1,6})\s*", answer)
    return int(match.group(1)) if match else None


class ListMinimum(Environment):
    name = "list_minimum"
    description = "The smallest value of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(-99, 99) for _ in range(3 + 2 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return min(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the smallest of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse(answer) == reference else 0.0


class ListMaximum(Environment):
    name = "list_maximum"
    description = "The largest value of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(-99, 99) for _ in range(3 + 2 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return max(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the largest of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse(answer) == reference else 0.0
