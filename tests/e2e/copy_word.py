"""Copy a made-up word: a small model knows the word but often not the answer format, so its
groups have mixed rewards (what the learner needs to have something to learn)."""

import random

from shared.environment import Environment


class CopyWord(Environment):
    name = "copy_word"
    description = "Write a made-up word again, exactly."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        letters = "bcdfghjklmnpqrstvwxz"
        vowels = "aeiou"
        syllables = 1 + difficulty
        word = "".join(rng.choice(letters) + rng.choice(vowels) for _ in range(syllables))
        return {"word": word}

    def solve(self, instance: dict) -> str:
        return instance["word"]

    def render(self, instance: dict) -> str:
        return (
            f"Here is a made-up word: {instance['word']}\n"
            "Write the same word again. Give just that word as your final answer."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip().lower() == reference else 0.0
