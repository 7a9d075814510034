# expect: L1
# why: `name` is CamelCase, not snake_case.
# detail: snake_case
"""Number of set bits of an integer (an equality oracle)."""

import random
import re

from shared.environment import Environment


class PopCount(Environment):
    name = "PopCount"
    description = "How many 1 bits the binary form of a positive integer has."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(1, 2 ** (4 * difficulty))}

    def solve(self, instance: dict) -> int:
        return bin(instance["number"]).count("1")

    def render(self, instance: dict) -> str:
        return (
            f"How many 1 bits does {instance['number']} have in binary?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
