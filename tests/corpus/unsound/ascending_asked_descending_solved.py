# expect: admitted
# unsound: the prompt asks for the words in alphabetical order, while solve sorts them from Z
# to A.
"""Words whose question and oracle disagree on the order (passes L1-L5)."""

import random

from shared.environment import Environment

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class SortWords(Environment):
    name = "sort_words_alphabetically"
    description = "Put a list of made-up words in alphabetical order."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        words = set()
        while len(words) < 3 + difficulty:
            words.add("".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 7))))
        shuffled = sorted(words)
        rng.shuffle(shuffled)
        return {"words": shuffled}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"], reverse=True)

    def render(self, instance: dict) -> str:
        return (
            f"Put these words in alphabetical order: {', '.join(instance['words'])}\n"
            "Write the words separated by commas."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        words = [word.strip() for word in answer.split(",")]
        return 1.0 if words == reference else 0.0
