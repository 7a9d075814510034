# expect: admitted
# odd but sound: score returns a bool (True/False), which the framework converts to 1.0/0.0.
"""Greatest common divisor of several integers (an equality oracle: Euclid's algorithm)."""

import functools
import math
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([0-9]{1,12})\s*\.?\s*")


class GcdOfList(Environment):
    name = "gcd_of_list"
    description = "The greatest common divisor of a list of positive integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # A common factor is planted so that the answer is rarely 1; the true gcd may be a
        # multiple of it. Difficulty 1: 3 numbers below about 100; 10: 12 numbers below ~60,000.
        count = 2 + difficulty
        factor = rng.randint(2, 4 + 4 * difficulty)
        high = 5 * difficulty * difficulty
        return {"numbers": [factor * rng.randint(1, high + 5) for _ in range(count)]}

    def solve(self, instance: dict) -> int:
        return functools.reduce(math.gcd, instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"What is the greatest common divisor of the following {len(instance['numbers'])} "
            f"positive integers?\n{numbers}\n\n"
            "The greatest common divisor is the largest positive integer that divides every one "
            "of them exactly.\n"
            "Give the answer as a single positive integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> bool:
        match = INTEGER.fullmatch(answer)
        return match is not None and int(match.group(1)) == reference
