# expect: L2
# why: at the maximum difficulty the instance carries a precomputed table of 200,000 entries, a
# result of over 1 MiB, past the sandbox's output limit (the prompt itself stays short).
# detail: output
# trigger: seed difficulty=10
"""The n-th term of a recurrence modulo m (an equality oracle)."""

import random
import re

from shared.environment import Environment


class RecurrenceTerm(Environment):
    name = "recurrence_term"
    description = "The n-th term of x(k+1) = (a * x(k) + c) mod m."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        a, c, m = rng.randint(2, 50), rng.randint(1, 50), rng.randint(10_000, 999_999)
        n = 2 * difficulty ** 5  # 2 .. 200,000
        table = [1]
        for _ in range(n):
            table.append((a * table[-1] + c) % m)
        return {"a": a, "c": c, "m": m, "n": n, "table": table}  # bug: ships the whole table

    def solve(self, instance: dict) -> int:
        return instance["table"][instance["n"]]

    def render(self, instance: dict) -> str:
        return (
            f"Let x(0) = 1 and x(k+1) = ({instance['a']} * x(k) + {instance['c']}) mod "
            f"{instance['m']}. What is x({instance['n']})?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,7})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
