# expect: admitted
# odd but sound: the answer is one of the numbers shown in the prompt (a selection task); answers
# have at most 7 characters, below the 8-character leak rule.
"""Pick the largest of a list of distinct integers (an equality oracle: a maximum)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([0-9]{1,9})\s*\.?\s*")


class LargestOfList(Environment):
    name = "largest_of_list"
    description = "Which number in a list of distinct integers of similar size is the largest."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 7 two-digit numbers. Difficulty 10: 34 seven-digit numbers that share
        # their leading digits, so they must be compared digit by digit.
        digits = min(7, 1 + (difficulty + 1) // 2 + difficulty // 4)
        count = 4 + 3 * difficulty
        base = rng.randint(1, 9) * 10 ** (digits - 1)
        spread = max(count * 3, 10 ** (digits - 1) // (1 + difficulty))
        spread = min(spread, 10 ** digits - base)
        numbers = rng.sample(range(base, base + spread), count)
        return {"numbers": numbers}

    def solve(self, instance: dict) -> int:
        return max(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = "\n".join(str(number) for number in instance["numbers"])
        return (
            f"Here are {len(instance['numbers'])} different positive integers, one per line:\n"
            f"{numbers}\n\n"
            "Which of them is the largest?\n"
            "Write the final answer as that number, digits only."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
