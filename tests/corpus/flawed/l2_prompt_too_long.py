# expect: L2
# why: at the maximum difficulty the prompt lists 5,000 numbers, far over the 16 KiB limit.
# trigger: seed difficulty=10
# detail: 16384
"""Count the even numbers of a long list (an equality oracle)."""

import random
import re

from shared.environment import Environment


class CountEvens(Environment):
    name = "count_evens"
    description = "How many numbers of a list are even."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        count = 50 * difficulty * difficulty  # 50 .. 5,000 numbers
        return {"numbers": [rng.randint(1, 9999) for _ in range(count)]}

    def solve(self, instance: dict) -> int:
        return sum(1 for n in instance["numbers"] if n % 2 == 0)

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"How many of these numbers are even?\n{numbers}\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,6})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
