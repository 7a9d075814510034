# expect: L4
# why: difficulty is ignored: the instance has the same size and value range at every difficulty.
# trigger: none
# detail: difficulty does not matter
"""Last digit of the product of six integers (an equality oracle)."""

import random
import re

from shared.environment import Environment


class LastDigitOfProduct(Environment):
    name = "last_digit_of_product"
    description = "The last digit of the product of a few integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # no difficulty anywhere; odd last digits other than 5, so the product ends in any of
        # 1, 3, 7, 9 (not in 0 as often as not): the references vary whatever the seeds
        return {"numbers": [10 * rng.randint(10, 99) + rng.choice((1, 3, 7, 9)) for _ in range(6)]}

    def solve(self, instance: dict) -> int:
        product = 1
        for n in instance["numbers"]:
            product *= n
        return product % 10

    def render(self, instance: dict) -> str:
        numbers = " x ".join(str(n) for n in instance["numbers"])
        return (
            f"What is the last decimal digit of {numbers}?\nGive the answer as a single digit."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9])\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
