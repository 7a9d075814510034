# expect: L4
# why: the prompt shows the list's length and first number but not the list, so instances with
# the same prompt have different answers: no answer is right for the prompt (prompts still vary,
# so the distinct-prompt rule alone passes it). A generated file of this kind (a GCD whose prompt
# named only the first number) passed review and, by luck, calibration.
# detail: the prompt does not determine the answer
# trigger: seed difficulty
"""Sum of a list (an equality oracle whose renderer shows only part of the list)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class PartialSum(Environment):
    name = "partial_sum"
    description = "The sum of a list of small integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 9) for _ in range(2 + difficulty)]}

    def solve(self, instance: dict) -> int:
        return sum(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = instance["numbers"]
        return (
            f"A list holds {len(numbers)} integers from 1 to 9; the first one is {numbers[0]}.\n"
            "What is the sum of the list? Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
