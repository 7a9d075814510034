# expect: L1
# why: dispatches on an operation name with the forbidden `getattr`.
# detail: 'getattr'
"""Apply a named operation to two integers (an equality oracle)."""

import random
import re

from shared.environment import Environment

OPERATIONS = ("add", "subtract", "multiply")


class NamedOperation(Environment):
    name = "named_operation"
    description = "Apply add, subtract or multiply to two integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        high = 10 ** difficulty
        return {"op": rng.choice(OPERATIONS), "a": rng.randint(1, high), "b": rng.randint(1, high)}

    def solve(self, instance: dict) -> int:
        return getattr(self, "_" + instance["op"])(instance["a"], instance["b"])

    def _add(self, a: int, b: int) -> int:
        return a + b

    def _subtract(self, a: int, b: int) -> int:
        return a - b

    def _multiply(self, a: int, b: int) -> int:
        return a * b

    def render(self, instance: dict) -> str:
        return (
            f"Apply the operation '{instance['op']}' to a = {instance['a']} and "
            f"b = {instance['b']} (for subtract: a - b).\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([+-]?[0-9]{1,25})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
