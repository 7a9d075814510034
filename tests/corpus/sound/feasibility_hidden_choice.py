# expect: admitted
# odd but sound: the instance holds a choice the prompt does not show (which divisor the oracle
# names), so instances with the same prompt have different references; but the scorer accepts
# any divisor, so each one's reference is right for the other's prompt too. The prompt still
# determines which answers are right, as L4 asks.
"""A proper divisor of a composite number (a feasibility oracle: many answers are right)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([0-9]{1,12})\s*\.?\s*")


def _proper_divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


class ProperDivisor(Environment):
    name = "proper_divisor"
    description = "Name a divisor of a composite number other than 1 and the number itself."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        high = 12 * difficulty**3
        while True:
            n = rng.randint(4, high)
            if _proper_divisors(n):
                return {"n": n, "pick": rng.randint(0, 99)}

    def solve(self, instance: dict) -> int:
        divisors = _proper_divisors(instance["n"])
        return divisors[instance["pick"] % len(divisors)]

    def render(self, instance: dict) -> str:
        return (
            f"Name a divisor of {instance['n']} other than 1 and {instance['n']} itself.\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        if match is None:
            return 0.0
        d = int(match.group(1))
        return 1.0 if 1 < d < instance["n"] and instance["n"] % d == 0 else 0.0
