"""Multiply two random integers of 20 or more digits exactly: sound and trivial for the oracle,
beyond a 0.5B model working in words, so the solver (practically) never gets it right."""

import random

from shared.environment import Environment


class LongProduct(Environment):
    name = "long_product"
    description = "Multiply two long integers exactly."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        digits = 19 + difficulty
        low, high = 10 ** (digits - 1), 10**digits - 1
        return {"a": rng.randint(low, high), "b": rng.randint(low, high)}

    def solve(self, instance: dict) -> int:
        return instance["a"] * instance["b"]

    def render(self, instance: dict) -> str:
        return (
            f"Compute the exact product {instance['a']} * {instance['b']}.\n"
            "Give the product as an integer with no separators as your final answer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        digits = answer.strip().replace(",", "").replace(" ", "")
        return 1.0 if digits.isdigit() and int(digits) == reference else 0.0
