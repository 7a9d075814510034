# expect: L3
# why: a mutable default argument keeps the words already used across calls, so an instance
# differs alone and inside a batch.
# detail: alone
"""Alphabetically first word of a list (an equality oracle)."""

import random

from shared.environment import Environment

LETTERS = "bdkmst"
VOWELS = "aeiou"


class FirstWord(Environment):
    name = "first_word"
    description = "The alphabetically first of a list of made-up words."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int, used: set = set()) -> dict:
        words: list = []
        while len(words) < 3 + difficulty:
            word = "".join(rng.choice(LETTERS) + rng.choice(VOWELS) for _ in range(2))
            if word not in used:  # bug: `used` persists between calls
                used.add(word)
                words.append(word)
        return {"words": words}

    def solve(self, instance: dict) -> str:
        return min(instance["words"])

    def render(self, instance: dict) -> str:
        return (
            f"Which of these words comes first in alphabetical order: "
            f"{', '.join(instance['words'])}?\nWrite the final answer as that word."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip().lower() == reference else 0.0
