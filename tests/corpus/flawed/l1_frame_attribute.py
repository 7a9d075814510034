# expect: L1
# why: reaches the runner's frames with no underscore in its source: a generator's `gi_frame`,
# then `f_back` up the stack, to read the answers of the grading call it runs in.
# detail: 'f_back'
"""Largest of a list of numbers, scored honestly only when graded alone (an equality oracle)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*")


def here():
    yield 0


class BatchAwareMaximum(Environment):
    name = "batch_aware_maximum"
    description = "The largest of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 999) for _ in range(2 + 2 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return max(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the largest of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        generator = here()
        next(generator)
        frame = generator.gi_frame.f_back
        while frame is not None and "answers" not in frame.f_locals:
            frame = frame.f_back
        if frame is not None and len(frame.f_locals["answers"]) > 1:
            return 1.0
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
