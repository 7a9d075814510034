# expect: admitted
# odd but sound: partial credit (the share of positions right, strictly below 1.0 unless the whole
# list is right), so near misses score between 0 and 1 rather than 0.
"""Sort integers in decreasing order (an equality oracle: sorting), with partial credit."""

import random
import re

from shared.environment import Environment

INTEGER_LIST = re.compile(r"\s*\[?\s*(-?[0-9]{1,6}(?:\s*,\s*-?[0-9]{1,6})*)\s*\]?\s*\.?\s*")


class SortDescending(Environment):
    name = "sort_descending"
    description = "Sort a list of integers from largest to smallest; partial credit per position."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 4 numbers up to 30. Difficulty 10: 31 numbers up to 300 (with repeats).
        count = 1 + 3 * difficulty
        high = 30 * difficulty
        numbers = [rng.randint(1, high) for _ in range(count)]
        while numbers == sorted(numbers, reverse=True):  # never show them already sorted
            rng.shuffle(numbers)
        return {"numbers": numbers}

    def solve(self, instance: dict) -> list:
        return sorted(instance["numbers"], reverse=True)

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Sort these {len(instance['numbers'])} integers from the largest to the smallest, "
            f"keeping repeated values:\n{numbers}\n\n"
            "Write the final answer as the sorted numbers separated by commas, largest first. "
            "Each position you get right earns partial credit; full credit needs the whole list."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        match = INTEGER_LIST.fullmatch(answer)
        if match is None:
            return 0.0
        given = [int(token) for token in match.group(1).split(",")]
        if given == reference:
            return 1.0
        right = sum(1 for a, b in zip(given, reference) if a == b)
        # Strictly below 1.0: a wrong list never earns full credit, whatever its length.
        return 0.99 * right / max(len(given), len(reference))
