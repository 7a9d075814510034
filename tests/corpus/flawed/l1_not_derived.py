# expect: L1
# why: the class has all four routines but does not derive from Environment (duck typing).
# detail: exactly one class
"""Reverse the words of a sentence (an equality oracle)."""

import random

from shared.environment import Environment  # noqa: F401 - imported but not used as the base

WORDS = ("red", "blue", "green", "stone", "river", "cloud", "night", "light", "sand")


class ReverseWords:
    name = "reverse_words"
    description = "Reverse the order of the words of a sentence."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"words": [rng.choice(WORDS) for _ in range(2 + difficulty)]}

    def solve(self, instance: dict) -> str:
        return " ".join(reversed(instance["words"]))

    def render(self, instance: dict) -> str:
        return (
            f"Reverse the order of the words of: {' '.join(instance['words'])}\n"
            "Write the final answer as the words in the new order, separated by single spaces."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if " ".join(answer.split()) == reference else 0.0
