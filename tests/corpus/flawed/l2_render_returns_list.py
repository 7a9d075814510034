# expect: L2
# why: render returns a list of lines instead of a string.
# trigger: seed difficulty=1
# detail: render
"""Count the multiples of k in a range (an equality oracle)."""

import random
import re

from shared.environment import Environment


class CountMultiples(Environment):
    name = "count_multiples"
    description = "How many multiples of k lie between a and b."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        a = rng.randint(1, 10 ** difficulty)
        return {"a": a, "b": a + rng.randint(1, 10 ** difficulty), "k": rng.randint(2, 9 + difficulty)}

    def solve(self, instance: dict) -> int:
        a, b, k = instance["a"], instance["b"], instance["k"]
        return b // k - (a - 1) // k

    def render(self, instance: dict) -> list:
        return [
            f"How many multiples of {instance['k']} lie between {instance['a']} and {instance['b']} "
            "(both included)?",
            "Give the answer as a single integer.",
        ]

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,12})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
