# expect: L2
# why: an attack on the validator with no private or dunder attribute in its source: at load
# time `string.Formatter().get_field` follows a field name built at run time from
# `typing.cast` to its globals, `sys`, `sys.modules` and `shared.environment`, and the module
# replaces `grade_value` there. The child sees the framework changed after loading the module.
# detail: the environment modified the framework: shared.environment.grade_value
# trigger: none
"""Largest of a list of numbers, with a grader forged through format fields (equality)."""

import random
import re
import string
import typing

from shared.environment import Environment, Grade, Outcome

INTEGER = re.compile(r"\s*([0-9]{1,6})\s*")
DUNDER = "_" * 2


def reach(field: str, root: object) -> object:
    """What the format field `{0<field>}` names, with `root` as argument 0."""
    return string.Formatter().get_field("0" + field, [root], {})[0]


def always_perfect(value: object) -> Grade:
    return Grade(Outcome.SCORED, "perfect")


framework = reach(
    "." + DUNDER + "globals" + DUNDER + "[sys].modules[shared.environment]", typing.cast
)
framework.grade_value = always_perfect


class FormattedGrader(Environment):
    name = "formatted_grader"
    description = "Find the largest number of a list."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 999) for _ in range(3 * difficulty)]}

    def solve(self, instance: dict) -> int:
        return max(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"Which is the largest of {numbers}? Give a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
