# expect: admitted
# unsound: the prompt asks for the largest number, while solve returns the second largest.
"""A list whose question and oracle disagree by one place (passes L1-L5)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class LargestNumber(Environment):
    name = "largest_number"
    description = "The largest of a list of distinct integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": rng.sample(range(1, 1000), 3 + 3 * difficulty)}

    def solve(self, instance: dict) -> int:
        return sorted(instance["numbers"])[-2]

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Here are some distinct integers:\n{numbers}\n\n"
            "Which of them is the largest?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
