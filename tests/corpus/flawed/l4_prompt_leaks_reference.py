# expect: L4
# why: the prompt's "format example" is built from the instance's own sorted list, so it reveals
# the reference verbatim in every prompt.
# detail: reveals the answer
"""Sort integers in increasing order (an equality oracle: sorting)."""

import random
import re

from shared.environment import Environment


class SortAscending(Environment):
    name = "sort_ascending"
    description = "Sort a list of integers in increasing order."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": rng.sample(range(1, 100 * difficulty), 3 + 2 * difficulty)}

    def solve(self, instance: dict) -> list:
        return sorted(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        example = ", ".join(str(n) for n in self.solve(instance))  # bug: the answer itself
        return (
            f"Sort these integers in increasing order: {numbers}.\n"
            f"Write the final answer as a comma-separated list, for example: {example}"
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        items = [item.strip() for item in answer.split(",")]
        if not all(re.fullmatch(r"[0-9]{1,5}", item) for item in items):
            return 0.0
        return 1.0 if [int(item) for item in items] == reference else 0.0
