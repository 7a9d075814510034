"""Attack: lift the recursion limit and recurse through C until the C stack dies.

Python-to-Python calls do not use the C stack in 3.11, so it recurses through `repr` of a
deeply nested list. Contained by the fork: only the child dies (SIGSEGV, `crash`).
"""

import random
import sys

from shared.environment import Environment


class Nested(Environment):
    name = "nested_lists"
    description = "Count the nesting depth of brackets."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"depth": rng.randint(1, 5)}

    def solve(self, instance: dict) -> int:
        return instance["depth"]

    def render(self, instance: dict) -> str:
        return "[" * instance["depth"] + "]" * instance["depth"]

    def score(self, instance: dict, reference: int, answer: str) -> float:
        sys.setrecursionlimit(1 << 30)
        nested: list = []
        for _ in range(300_000):
            nested = [nested]
        return float(len(repr(nested)) > 0)
