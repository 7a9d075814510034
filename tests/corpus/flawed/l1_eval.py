# expect: L1
# why: the oracle computes the value of an arithmetic expression with the forbidden `eval`.
# detail: 'eval'
"""Evaluate an arithmetic expression (an equality oracle)."""

import random
import re

from shared.environment import Environment


class ArithmeticExpression(Environment):
    name = "arithmetic_expression"
    description = "The value of an integer arithmetic expression with +, - and *."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        terms = [str(rng.randint(1, 9 * difficulty)) for _ in range(2 + difficulty)]
        expression = terms[0]
        for term in terms[1:]:
            expression += f" {rng.choice('+-*')} {term}"
        return {"expression": expression}

    def solve(self, instance: dict) -> int:
        return eval(instance["expression"])

    def render(self, instance: dict) -> str:
        return (
            f"Compute {instance['expression']} (usual precedence: * before + and -).\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([+-]?[0-9]{1,12})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
