# expect: admitted
# odd but sound: the reference is a JSON object (not a scalar or list), answer_text is custom, and
# the difficulty range starts at 0 (tested at 0, 2 and 4).
"""Smallest and largest value of a list of signed integers (an equality oracle: a scan)."""

import random
import re

from shared.environment import Environment

TWO_INTEGERS = re.compile(r"\s*([+-]?[0-9]{1,9})\s*,\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class MinAndMax(Environment):
    name = "min_and_max"
    description = "The smallest and the largest value of a list of signed integers."
    oracle = "equality"
    min_difficulty = 0
    max_difficulty = 4

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 0: 4 values in [-20, 20]. Difficulty 4: 28 values in [-2000, 2000].
        count = 4 + 6 * difficulty
        bound = 20 * 10 ** (difficulty // 2)
        return {"values": [rng.randint(-bound, bound) for _ in range(count)]}

    def solve(self, instance: dict) -> dict:
        values = instance["values"]
        return {"min": min(values), "max": max(values)}

    def render(self, instance: dict) -> str:
        values = ", ".join(str(value) for value in instance["values"])
        return (
            f"Here are {len(instance['values'])} integers, some of them negative:\n{values}\n\n"
            "What are the smallest and the largest of them?\n"
            "Write the final answer as the smallest value, a comma, then the largest value, "
            "for example: -17, 42"
        )

    def answer_text(self, reference: dict) -> str:
        return f"{reference['min']}, {reference['max']}"

    def score(self, instance: dict, reference: dict, answer: str) -> float:
        match = TWO_INTEGERS.fullmatch(answer)
        if match is None:
            return 0.0
        low, high = int(match.group(1)), int(match.group(2))
        return 1.0 if (low, high) == (reference["min"], reference["max"]) else 0.0
