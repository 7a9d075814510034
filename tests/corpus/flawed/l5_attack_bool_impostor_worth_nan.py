# expect: L5
# why: an attack on the validator: on an answer that is not an integer the scorer returns an
# object posing as a bool (its `__class__` says bool, so `isinstance(x, bool)` holds) whose float
# is NaN, built with `type()` from names made at run time (no dunder in the source). NaN compares
# false both ways, so the "must score below 1.0" probes passed and the file was admitted. A
# score must be exactly a bool, an int or a float.
# detail: score has type Verdict
"""Count the distinct values in a list (an equality oracle), scored with an impostor."""

import math
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([0-9]{1,4})\s*")
DUNDER = "_" * 2
Verdict = type(
    "Verdict",
    (),
    {
        DUNDER + "class" + DUNDER: property(lambda self: bool),
        DUNDER + "float" + DUNDER: lambda self: math.nan,
    },
)


class ImpostorCount(Environment):
    name = "impostor_count"
    description = "Count how many different values occur in a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        length = 4 + 4 * difficulty
        return {"numbers": [rng.randint(1, 3 + 2 * difficulty) for _ in range(length)]}

    def solve(self, instance: dict) -> int:
        return len(set(instance["numbers"]))

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"How many different values occur in this list: {numbers}? (A value that occurs "
            "several times counts once.) Give a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> object:
        match = INTEGER.fullmatch(answer)
        if match is None:
            return Verdict()  # not an integer at all: "false", worth NaN
        return 1.0 if int(match.group(1)) == reference else 0.0
