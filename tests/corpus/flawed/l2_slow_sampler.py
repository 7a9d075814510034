# expect: L2
# why: at the maximum difficulty the sampler searches so inefficiently that it runs for seconds
# (about 3-6 s on a typical CPU), over the per-call limit the test sets (2 s).
# trigger: seed difficulty=10
# detail: time limit
"""Count the lattice points inside a circle (an equality oracle)."""

import random
import re

from shared.environment import Environment


class LatticePointsInCircle(Environment):
    name = "lattice_points_in_circle"
    description = "How many integer points (x, y) satisfy x*x + y*y <= r*r."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        radius = rng.randint(2 * difficulty, 5 * difficulty)
        if difficulty == self.max_difficulty:
            # "Warm-up" that picks a radius by brute force: tens of millions of steps.
            best = 0
            for k in range(60_000_000):
                best = (best * 31 + k) % 1_000_003
            radius += best % 3
        return {"radius": radius}

    def solve(self, instance: dict) -> int:
        r = instance["radius"]
        return sum(1 for x in range(-r, r + 1) for y in range(-r, r + 1) if x * x + y * y <= r * r)

    def render(self, instance: dict) -> str:
        return (
            f"How many points (x, y) with integer coordinates satisfy x^2 + y^2 <= "
            f"{instance['radius'] ** 2}?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
