# expect: L1
# why: `name` is "sort_words" plus a final newline: a regex whose `$` matches before a final
# newline would call it snake_case, and the pool would show it as a second `sort_words`.
# detail: snake_case
"""Sort a list of words alphabetically (an equality oracle: sorting)."""

import random

from shared.environment import Environment

WORDS = ["apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "iris", "jade"]


class SortWordsImpostor(Environment):
    name = "sort_words\n"
    description = "Sort a list of words alphabetically."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"words": [rng.choice(WORDS) for _ in range(2 + difficulty)]}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"])

    def render(self, instance: dict) -> str:
        words = ", ".join(instance["words"])
        return (
            f"Sort these words alphabetically, keeping repeats: {words}\n"
            "Write the sorted words separated by commas."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        return 1.0 if [word.strip() for word in answer.split(",")] == reference else 0.0
