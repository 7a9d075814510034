# expect: L5
# why: the scorer's hand-written digit parser never advances past a letter, so it loops forever
# on garbage text and runs past the time limit.
# detail: time limit
"""Sum of the digits of a product (an equality oracle)."""

import random

from shared.environment import Environment


class ProductDigitSum(Environment):
    name = "product_digit_sum"
    description = "The sum of the digits of the product of two integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        high = 10 ** difficulty
        return {"a": rng.randint(2, high), "b": rng.randint(2, high)}

    def solve(self, instance: dict) -> int:
        return sum(int(d) for d in str(instance["a"] * instance["b"]))

    def render(self, instance: dict) -> str:
        return (
            f"What is the sum of the decimal digits of {instance['a']} x {instance['b']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        digits, i = "", 0
        while i < len(answer):
            if answer[i].isdigit():
                digits += answer[i]
                i += 1
            elif answer[i] in " \t\n.":
                i += 1
            # bug: any other character is never skipped, so the loop spins forever
        return 1.0 if digits and len(digits) < 6 and int(digits) == reference else 0.0
