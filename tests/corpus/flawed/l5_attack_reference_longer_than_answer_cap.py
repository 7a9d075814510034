# expect: L5
# why: at the max difficulty the reference's answer text (a sorted list of 900 numbers) is
# longer than the answer cap (4,096 characters), so no solver's answer could ever match it: the
# reference probe goes through extraction as a real answer does. It used to be scored as it was,
# without extraction, and the file was admitted.
# detail: exceeds the cap of 4096
# trigger: seed difficulty=10
"""Sort a list of numbers (an equality oracle) whose longest answers do not fit the cap."""

import random
import re

from shared.environment import Environment

SEPARATOR = re.compile(r"\s*,\s*")


class SortManyNumbers(Environment):
    name = "sort_many_numbers"
    description = "Sort a list of numbers in increasing order."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        length = 90 * difficulty
        return {"numbers": [rng.randint(1000, 9999) for _ in range(length)]}

    def solve(self, instance: dict) -> list:
        return sorted(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"Sort these {len(instance['numbers'])} numbers in increasing order: {numbers}.\n"
            "Give them as a comma-separated list."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        parts = SEPARATOR.split(answer.strip())
        if not all(part.isdigit() for part in parts):
            return 0.0
        return 1.0 if [int(part) for part in parts] == reference else 0.0
