# expect: L2
# why: a plain environment whose reference is an integer of 4,300 digits, Python's limit for
# turning an int into text: one more digit (a perturbation of it, +1) and `str` raises, which
# used to crash the validator on the host. The host refuses integers of more than 4,000 digits.
# detail: more than 4000 digits
"""The number just below a power of ten, minus a small offset (an equality oracle)."""

import random

from shared.environment import Environment

DIGITS = 4300


class NinesMinusOffset(Environment):
    name = "nines_minus_offset"
    description = "Subtract a small number from the largest number of 4,300 digits."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"offset": rng.randint(0, 10**difficulty)}

    def solve(self, instance: dict) -> int:
        return 10**DIGITS - 1 - instance["offset"]

    def render(self, instance: dict) -> str:
        return (
            f"Write out 10^{DIGITS} - 1 - {instance['offset']} in full, as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if answer.strip() == str(reference) else 0.0
