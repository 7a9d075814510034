# expect: L1
# why: reads a word list from disk with the forbidden `open` (file access).
# detail: 'open'
"""Count the vowels of a dictionary word (an equality oracle)."""

import random
import re

from shared.environment import Environment


class CountVowels(Environment):
    name = "count_vowels"
    description = "How many vowels a word contains."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        with open("/usr/share/dict/words") as handle:
            words = [w.strip() for w in handle if len(w.strip()) == 3 + difficulty]
        return {"word": rng.choice(words)}

    def solve(self, instance: dict) -> int:
        return sum(1 for letter in instance["word"].lower() if letter in "aeiou")

    def render(self, instance: dict) -> str:
        return (
            f"How many vowels (a, e, i, o, u) does the word '{instance['word']}' contain?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
