# expect: L5
# why: a float answer is accepted within 60% of the reference, so the perturbed answer (1.5 times
# the reference), or another instance's answer near it, is accepted although it differs from it.
# detail: which differs from the reference
"""Average speed over a trip (an equality oracle with a far too loose tolerance)."""

import random
import re

from shared.environment import Environment


class AverageSpeed(Environment):
    name = "average_speed"
    description = "The average speed, in km/h, over a trip made of several legs."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        legs = [[rng.randint(5, 120), rng.randint(1, 4)] for _ in range(1 + difficulty)]
        return {"legs": legs}  # each leg: [distance in km, hours]

    def solve(self, instance: dict) -> float:
        distance = sum(leg[0] for leg in instance["legs"])
        hours = sum(leg[1] for leg in instance["legs"])
        return distance / hours

    def render(self, instance: dict) -> str:
        legs = "; ".join(f"{d} km in {h} h" for d, h in instance["legs"])
        return (
            f"A trip has these legs: {legs}.\nWhat is the average speed over the whole trip, in "
            "km/h?\nWrite the final answer as a decimal number."
        )

    def answer_text(self, reference: float) -> str:
        return f"{reference:.4f}"

    def score(self, instance: dict, reference: float, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6}(?:\.[0-9]{1,12})?)\s*", answer)
        if match is None:
            return 0.0
        return 1.0 if abs(float(match.group(1)) - reference) <= 0.6 * reference else 0.0
