# expect: admitted
# odd but sound: score returns the int 1 or 0, not a float (the contract allows int, float or bool).
"""Count the distinct values in a list of small integers (an equality oracle: counting)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class CountDistinctValues(Environment):
    name = "count_distinct_values"
    description = "Count how many different values occur in a list of integers with repeats."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 8 numbers from 1..5 (many repeats). Difficulty 10: 44 numbers from 1..23.
        length = 4 + 4 * difficulty
        high = 3 + 2 * difficulty
        return {"numbers": [rng.randint(1, high) for _ in range(length)]}

    def solve(self, instance: dict) -> int:
        return len(set(instance["numbers"]))

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Here is a list of {len(instance['numbers'])} integers, some of them repeated:\n"
            f"{numbers}\n\n"
            "How many different values occur in the list? (A value that occurs several times "
            "counts once.)\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> int:
        match = INTEGER.fullmatch(answer)
        if match is None:
            return 0
        return 1 if int(match.group(1)) == reference else 0
