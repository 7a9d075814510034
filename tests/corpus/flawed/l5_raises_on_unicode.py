# expect: L5
# why: the scorer encodes the answer as ASCII, which raises UnicodeEncodeError on non-ASCII text
# (one of the garbage probes).
# detail: UnicodeEncodeError
"""Roman numeral of an integer (an equality oracle)."""

import random

from shared.environment import Environment

NUMERALS = (
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
)


class RomanNumeral(Environment):
    name = "roman_numeral"
    description = "Write a positive integer in Roman numerals."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"number": rng.randint(1, min(3999, 10 + 400 * (difficulty - 1)))}

    def solve(self, instance: dict) -> str:
        number, out = instance["number"], ""
        for value, letters in NUMERALS:
            while number >= value:
                out += letters
                number -= value
        return out

    def render(self, instance: dict) -> str:
        return (
            f"Write {instance['number']} in Roman numerals (standard subtractive form, e.g. "
            "4 is IV and 1994 is MCMXCIV).\nWrite the final answer as the numeral alone."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        text = answer.encode("ascii").decode().strip().upper()  # bug: raises on non-ASCII
        return 1.0 if text == reference else 0.0
