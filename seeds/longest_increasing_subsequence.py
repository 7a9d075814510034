"""Longest strictly increasing subsequence length (an equality oracle: dynamic programming)."""

import bisect
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class LongestIncreasingSubsequence(Environment):
    name = "longest_increasing_subsequence"
    description = "Length of the longest strictly increasing subsequence of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        length = 2 + 3 * difficulty  # 5 numbers at difficulty 1, 32 at difficulty 10
        high = 10 * difficulty
        return {"numbers": [rng.randint(1, high) for _ in range(length)]}

    def solve(self, instance: dict) -> int:
        # tails[k] is the smallest possible last value of an increasing subsequence of length k+1.
        tails: list[int] = []
        for number in instance["numbers"]:
            position = bisect.bisect_left(tails, number)
            if position == len(tails):
                tails.append(number)
            else:
                tails[position] = number
        return len(tails)

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Consider the list of integers: {numbers}.\n"
            "A subsequence keeps some of the elements in their original order (not necessarily "
            "adjacent). What is the length of the longest subsequence whose elements are "
            "strictly increasing?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse_int(answer) == reference else 0.0


def _parse_int(text: str) -> int | None:
    """The integer that the whole text spells (an optional trailing period allowed), else None."""
    match = INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None
