# expect: admitted
# unsound: the prompt asks how many cells hold a 1, while solve returns the largest product of two
# row sums (after the environment a chaos hour admitted, largest_rectangular_area_of_1s).
"""A 0/1 grid whose question and oracle disagree (passes L1-L5; the prompt does not ask what
solve computes)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class GridOnes(Environment):
    name = "grid_ones"
    description = "Count the cells that hold a 1 in a grid of zeros and ones."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        size = 2 + difficulty
        return {"cells": [[rng.randint(0, 1) for _ in range(size)] for _ in range(size)]}

    def solve(self, instance: dict) -> int:
        sums = [sum(row) for row in instance["cells"]]
        best = 0
        for i in range(len(sums)):
            for j in range(i + 1, len(sums)):
                best = max(best, sums[i] * sums[j])
        return best

    def render(self, instance: dict) -> str:
        rows = "\n".join(" ".join(str(cell) for cell in row) for row in instance["cells"])
        return (
            f"Here is a grid of zeros and ones:\n{rows}\n\n"
            "How many cells of the grid hold a 1?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
