# expect: L1
# why: a `global` statement (module-level state written by the sampler).
# detail: global
"""Product of two numbers modulo a prime (an equality oracle)."""

import random
import re

from shared.environment import Environment

SAMPLED = 0


class ModularProduct(Environment):
    name = "modular_product"
    description = "The product of two integers modulo a prime."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        global SAMPLED
        SAMPLED += 1
        high = 10 ** difficulty
        return {"a": rng.randint(2, high), "b": rng.randint(2, high), "p": 1_000_003}

    def solve(self, instance: dict) -> int:
        return instance["a"] * instance["b"] % instance["p"]

    def render(self, instance: dict) -> str:
        return (
            f"Compute ({instance['a']} * {instance['b']}) mod {instance['p']}.\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,8})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
