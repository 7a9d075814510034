# expect: L5
# why: the oracle answers with a 1-based position while the prompt and the scorer use 0-based
# positions, so the reference answer itself scores 0.
# detail: reference answer
"""Position of the maximum of a list (an equality oracle)."""

import random
import re

from shared.environment import Environment


class PositionOfMaximum(Environment):
    name = "position_of_maximum"
    description = "The 0-based position of the largest value of a list of distinct integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": rng.sample(range(1, 30 * difficulty), 3 + 2 * difficulty)}

    def solve(self, instance: dict) -> int:
        numbers = instance["numbers"]
        return numbers.index(max(numbers)) + 1  # bug: 1-based

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"In the list {numbers}, at which position is the largest value? Positions are "
            "counted from 0.\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*", answer)
        if match is None:
            return 0.0
        numbers, position = instance["numbers"], int(match.group(1))
        return 1.0 if position < len(numbers) and numbers[position] == max(numbers) else 0.0
