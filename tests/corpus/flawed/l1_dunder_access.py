# expect: L1
# why: uses the dunder attribute `__class__` (e.g. `answer.__class__`, the first step of the
# `().__class__.__base__.__subclasses__()` escape); only `__init__` is allowed.
# detail: __class__
"""Length of the longest run of equal letters (an equality oracle)."""

import itertools
import random
import re

from shared.environment import Environment


class LongestRun(Environment):
    name = "longest_run"
    description = "The length of the longest run of one repeated letter in a string."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"text": "".join(rng.choice("ab") for _ in range(5 + 4 * difficulty))}

    def solve(self, instance: dict) -> int:
        return max(len(list(group)) for _, group in itertools.groupby(instance["text"]))

    def render(self, instance: dict) -> str:
        return (
            f"In the string {instance['text']}, what is the length of the longest run of one "
            "letter repeated consecutively?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        if answer.__class__ is not str:
            return 0.0
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
