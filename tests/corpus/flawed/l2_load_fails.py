# expect: L2
# why: loading the module raises NameError: a module-level table is built with a helper that is
# only defined further down the file.
# detail: NameError
# trigger: none
"""Sum of the proper divisors of n (an equality oracle)."""

import random
import re

from shared.environment import Environment

SMALL_DIVISOR_SUMS = [_divisor_sum(n) for n in range(1, 50)]


def _divisor_sum(n: int) -> int:
    return sum(d for d in range(1, n) if n % d == 0)


class DivisorSum(Environment):
    name = "divisor_sum"
    description = "The sum of the proper divisors of a positive integer."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(2, 100 * difficulty * difficulty)}

    def solve(self, instance: dict) -> int:
        n = instance["n"]
        return SMALL_DIVISOR_SUMS[n - 1] if n < 50 else _divisor_sum(n)

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the proper divisors of {instance['n']} (all positive divisors "
            "except the number itself)?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,8})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
