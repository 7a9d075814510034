# expect: admitted
# odd but sound: a float answer accepted within 1e-6; answer_text rounds to 6 decimals (still 1.0),
# a value 1.5x the mean (the L5 perturbation) is far outside the tolerance.
"""Arithmetic mean of a list of integers, as a decimal (an equality oracle with a tolerance)."""

import random
import re

from shared.environment import Environment

DECIMAL = re.compile(r"\s*([+-]?[0-9]{1,12}(?:\.[0-9]{1,30})?)\s*")
TOLERANCE = 1e-6


class MeanOfReadings(Environment):
    name = "mean_of_readings"
    description = "The arithmetic mean of a list of integer readings, to within one millionth."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 3 readings up to 100. Difficulty 10: 21 readings up to 1000.
        count = 1 + 2 * difficulty
        high = 100 * difficulty
        return {"readings": [rng.randint(1, high) for _ in range(count)]}

    def solve(self, instance: dict) -> float:
        readings = instance["readings"]
        return sum(readings) / len(readings)

    def render(self, instance: dict) -> str:
        readings = ", ".join(str(value) for value in instance["readings"])
        return (
            f"A sensor produced these {len(instance['readings'])} readings: {readings}.\n"
            "What is their arithmetic mean (the sum divided by the number of readings)?\n"
            "Write the mean as a decimal number, for example 12.25 or 7 or 3.142857. Any value "
            "within 10⁻⁶ of the exact mean is accepted, so six decimal places are enough; do not "
            "write a fraction."
        )

    def answer_text(self, reference: float) -> str:
        return f"{reference:.6f}".rstrip("0").rstrip(".")

    def score(self, instance: dict, reference: float, answer: str) -> float:
        match = DECIMAL.fullmatch(answer)
        if match is None:
            return 0.0
        value = float(match.group(1))
        return 1.0 if abs(value - reference) <= TOLERANCE else 0.0
