"""Pick items of the greatest total worth under a weight limit (a near-copy of the knapsack seed:
identifiers renamed, the prompt reworded, the same algorithm)."""

import re
import random

from shared.environment import Environment

WHOLE_NUMBER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class BackpackBestWorth(Environment):
    name = "backpack_best_worth"
    description = "Largest total worth of a set of items whose combined weight stays within a limit."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        n_items = 1 + 2 * difficulty  # 3 items at difficulty 1, 21 at difficulty 10
        masses = [rng.randint(1, 3 + 3 * difficulty) for _ in range(n_items)]
        worths = [rng.randint(1, 10 * difficulty) for _ in range(n_items)]
        limit = max(max(masses), sum(masses) // 2)
        return {"weights": masses, "values": worths, "capacity": limit}

    def solve(self, instance: dict) -> int:
        limit = instance["capacity"]
        # table[w] is the best worth of the items seen so far with total weight at most w.
        table = [0] * (limit + 1)
        for mass, worth in zip(instance["weights"], instance["values"], strict=True):
            for w in range(limit, mass - 1, -1):
                table[w] = max(table[w], table[w - mass] + worth)
        return table[limit]

    def render(self, instance: dict) -> str:
        rows = [
            f"Item {number}: weight {mass}, value {worth}"
            for number, (mass, worth) in enumerate(
                zip(instance["weights"], instance["values"], strict=True), 1
            )
        ]
        return (
            f"A knapsack can carry a total weight of at most {instance['capacity']}. "
            "The items are:\n"
            + "\n".join(rows)
            + "\nEvery item may be used at most once. Select items with a total weight no more "
            "than the capacity so that the total value is maximised.\n"
            "What is the largest total value? Answer with a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _read_whole_number(answer) == reference else 0.0


def _read_whole_number(text: str) -> int | None:
    """The whole number the text spells (a trailing period allowed), or None."""
    found = WHOLE_NUMBER.fullmatch(text)
    return int(found.group(1)) if found else None
