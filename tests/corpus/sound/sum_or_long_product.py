# expect: admitted
# odd but sound: two kinds of instance in one environment, a sum of two short numbers (which a
# small model often gets right) and an exact product of two long numbers (which it never does),
# so a solver's pass rate lies strictly between 0 and 1 at every difficulty.
"""Compute a sum of two short integers or an exact product of two long ones (an equality
oracle: arithmetic)."""

import random

from shared.environment import Environment


class SumOrLongProduct(Environment):
    name = "sum_or_long_product"
    description = "Compute either a sum of two short integers or a product of two long integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Half the instances are sums of two integers of `difficulty` digits (one digit at the
        # minimum); the other half products of two integers of 8 + 4 * difficulty digits each.
        # Both kinds grow with the difficulty, so L4 sees it matter whichever kinds the
        # validation seeds draw.
        if rng.random() < 0.5:
            low, high = 10 ** (difficulty - 1), 10**difficulty - 1
            return {"operation": "sum", "a": rng.randint(low, high), "b": rng.randint(low, high)}
        digits = 8 + 4 * difficulty
        low, high = 10 ** (digits - 1), 10**digits - 1
        return {"operation": "product", "a": rng.randint(low, high), "b": rng.randint(low, high)}

    def solve(self, instance: dict) -> int:
        if instance["operation"] == "sum":
            return instance["a"] + instance["b"]
        return instance["a"] * instance["b"]

    def render(self, instance: dict) -> str:
        if instance["operation"] == "sum":
            return (
                f"What is {instance['a']} + {instance['b']}? "
                "Give just the number as your final answer."
            )
        return (
            f"Compute {instance['a']} * {instance['b']} exactly.\n"
            "Write the final answer as an integer in decimal digits, without separators."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        text = answer.strip().replace(",", "").replace(" ", "")
        return 1.0 if text == str(reference) else 0.0
