# expect: L1
# why: reads a module's private attribute, `random._inst` (the generator behind `random`'s
# functions, which the framework seeds with the instance's name, seed and difficulty); only the
# object's own private attributes, through self or cls, are allowed. Private attributes of
# modules lead further: `random._os.sys._getframe` reaches the runner's frames.
# detail: the private attribute '_inst'
"""Sum of a list of numbers, drawn from the module's own generator (an equality oracle)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*")


class PrivateGeneratorSum(Environment):
    name = "private_generator_sum"
    description = "Add up a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        source = random._inst
        return {"numbers": [source.randint(1, 99) for _ in range(2 + 2 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return sum(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the sum of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
