# expect: L2
# why: the instance is a dict with int keys (JSON turns them into strings, so it does not round-trip).
# detail: round trip
"""Total stock of a warehouse inventory (an equality oracle)."""

import random
import re

from shared.environment import Environment


class InventoryTotal(Environment):
    name = "inventory_total"
    description = "The total number of items in an inventory keyed by shelf number."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        shelves = rng.sample(range(1, 100), 2 + 2 * difficulty)
        return {shelf: rng.randint(0, 50 * difficulty) for shelf in shelves}

    def solve(self, instance: dict) -> int:
        return sum(instance.values())

    def render(self, instance: dict) -> str:
        lines = "\n".join(f"shelf {shelf}: {count} items" for shelf, count in instance.items())
        return (
            f"A warehouse inventory lists:\n{lines}\n"
            "How many items are there in total?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
