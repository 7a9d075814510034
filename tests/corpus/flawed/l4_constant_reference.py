# expect: L4
# why: the reference is the length of the list, which is fixed by the difficulty: one distinct
# reference per difficulty, although the prompts vary.
# trigger: difficulty
# detail: distinct reference
"""Count the numbers in a list (an equality oracle that is constant in disguise)."""

import random
import re

from shared.environment import Environment


class CountListItems(Environment):
    name = "count_list_items"
    description = "How many numbers a list contains."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 99) for _ in range(5 + 3 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return len(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = " ".join(str(n) for n in instance["numbers"])
        return f"How many numbers are in this list?\n{numbers}\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
