# expect: admitted
# unsound: the prompt asks for the greatest common divisor, while solve returns the least common
# multiple (a near miss: the same two numbers, the related question).
"""Two numbers whose question and oracle disagree (passes L1-L5)."""

import math
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,12})\s*\.?\s*")


class PairGcd(Environment):
    name = "pair_gcd"
    description = "The greatest common divisor of two positive integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 8

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        factor = rng.randint(2, 9)
        high = 10 ** (1 + difficulty // 2)
        return {"a": factor * rng.randint(2, high), "b": factor * rng.randint(2, high)}

    def solve(self, instance: dict) -> int:
        a, b = instance["a"], instance["b"]
        return a * b // math.gcd(a, b)

    def render(self, instance: dict) -> str:
        return (
            f"What is the greatest common divisor of {instance['a']} and {instance['b']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
