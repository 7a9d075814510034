# expect: L2
# why: an attack on the validator: at load time the module reaches `sys.modules` through
# `typing.sys` and replaces `grade_value` in `shared.environment`, which the runner looks up on
# every score, with one that grades every answer as the string "perfect". The child sees the
# framework changed after loading the module; the host would refuse a string as a score anyway.
# detail: the environment modified the framework: shared.environment.grade_value
# trigger: none
"""Sum of a list of numbers, with a forged grader (an equality oracle)."""

import random
import re
import typing

from shared.environment import Environment, Grade, Outcome

INTEGER = re.compile(r"\s*([0-9]{1,6})\s*")


def always_perfect(value: object) -> Grade:
    return Grade(Outcome.SCORED, "perfect")


typing.sys.modules["shared.environment"].grade_value = always_perfect


class ForgedGrader(Environment):
    name = "forged_grader"
    description = "Add up a list of numbers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 99) for _ in range(3 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return sum(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the sum of {numbers}? Give a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
