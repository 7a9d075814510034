# expect: L2
# why: at the maximum difficulty the sampler asks rng.sample for more distinct values than its
# range holds (24 from 1..20) and raises ValueError; min and middle difficulty work.
# trigger: seed difficulty=10
# detail: ValueError
"""Second-largest value of a list of distinct integers (an equality oracle)."""

import random
import re

from shared.environment import Environment


class SecondLargest(Environment):
    name = "second_largest"
    description = "The second-largest value of a list of distinct integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        count = 4 + 2 * difficulty  # 6 .. 24
        return {"numbers": rng.sample(range(1, 21), count)}  # bug: only 20 values to draw from

    def solve(self, instance: dict) -> int:
        return sorted(instance["numbers"])[-2]

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"Here are distinct integers: {numbers}.\nWhat is the second-largest of them?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
