"""0/1 knapsack: the best value within a weight capacity (an equality oracle: DP)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class KnapsackMaxValue(Environment):
    name = "knapsack_max_value"
    description = "Maximum total value of a subset of items whose total weight fits a capacity."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        count = 1 + 2 * difficulty  # 3 items at difficulty 1, 21 at difficulty 10
        weights = [rng.randint(1, 3 + 3 * difficulty) for _ in range(count)]
        values = [rng.randint(1, 10 * difficulty) for _ in range(count)]
        capacity = max(max(weights), sum(weights) // 2)
        return {"weights": weights, "values": values, "capacity": capacity}

    def solve(self, instance: dict) -> int:
        capacity = instance["capacity"]
        # best[c] is the best value using the items seen so far with total weight at most c.
        best = [0] * (capacity + 1)
        for weight, value in zip(instance["weights"], instance["values"], strict=True):
            for c in range(capacity, weight - 1, -1):
                best[c] = max(best[c], best[c - weight] + value)
        return best[capacity]

    def render(self, instance: dict) -> str:
        lines = [
            f"Item {index}: weight {weight}, value {value}"
            for index, (weight, value) in enumerate(
                zip(instance["weights"], instance["values"], strict=True), 1
            )
        ]
        return (
            "You have a knapsack with a weight capacity of "
            f"{instance['capacity']} and the following items:\n"
            + "\n".join(lines)
            + "\nEach item can be taken at most once. Choose items whose total weight is at most "
            "the capacity so that their total value is as large as possible.\n"
            "What is that maximum total value? Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse_int(answer) == reference else 0.0


def _parse_int(text: str) -> int | None:
    """The integer that the whole text spells (an optional trailing period allowed), else None."""
    match = INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None
