# expect: L2
# why: the oracle returns a tuple (row, column), which does not survive a JSON round trip.
# detail: round trip
"""Position of the largest entry of a grid (an equality oracle)."""

import random
import re

from shared.environment import Environment


class GridArgmax(Environment):
    name = "grid_argmax"
    description = "Row and column of the largest entry of a grid of distinct integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        size = 1 + difficulty
        values = rng.sample(range(1, 10 * size * size), size * size)
        return {"grid": [values[r * size:(r + 1) * size] for r in range(size)]}

    def solve(self, instance: dict) -> tuple:
        grid = instance["grid"]
        best = max(max(row) for row in grid)
        for r, row in enumerate(grid):
            if best in row:
                return (r, row.index(best))
        return (0, 0)

    def render(self, instance: dict) -> str:
        rows = "\n".join(" ".join(str(v) for v in row) for row in instance["grid"])
        return (
            f"Here is a grid of distinct integers, one row per line:\n{rows}\n"
            "Where is its largest entry? Rows and columns are numbered from 0.\n"
            "Write the final answer as: row, column"
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*,\s*([0-9]{1,3})\s*", answer)
        if match is None:
            return 0.0
        return 1.0 if [int(match.group(1)), int(match.group(2))] == list(reference) else 0.0
