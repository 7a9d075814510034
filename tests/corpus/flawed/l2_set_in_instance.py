# expect: L2
# why: the instance holds a set, which JSON cannot encode.
# detail: round trip
"""Size of the intersection of two sets of integers (an equality oracle)."""

import random
import re

from shared.environment import Environment


class IntersectionSize(Environment):
    name = "intersection_size"
    description = "How many integers two sets have in common."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        high = 10 + 10 * difficulty
        first = set(rng.sample(range(high), 3 + 2 * difficulty))
        second = sorted(rng.sample(range(high), 3 + 2 * difficulty))
        return {"first": first, "second": second}

    def solve(self, instance: dict) -> int:
        return len(set(instance["first"]) & set(instance["second"]))

    def render(self, instance: dict) -> str:
        first = ", ".join(str(n) for n in sorted(instance["first"]))
        second = ", ".join(str(n) for n in instance["second"])
        return (
            f"A = {{{first}}} and B = {{{second}}}. How many integers belong to both A and B?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
