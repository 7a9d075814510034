# expect: L2
# why: the words are decoded from bytes with errors="surrogateescape", so a byte that is no UTF-8
# becomes a lone surrogate (U+DCE9) in the reference and its answer text: no UTF-8 text, no
# JSON message or database can hold it.
# detail: lone surrogate
"""Reverse a word (an equality oracle)."""

import random

from shared.environment import Environment

SYLLABLES = [b"ca", b"f\xe9", b"lo", b"mi", b"ra", b"tu"]


class ReverseWord(Environment):
    name = "reverse_word"
    description = "Write a made-up word backwards."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        parts = [rng.randrange(len(SYLLABLES)) for _ in range(2 + difficulty)]
        return {"parts": parts}

    def solve(self, instance: dict) -> str:
        word = b"".join(SYLLABLES[k] for k in instance["parts"])
        return word.decode("utf-8", "surrogateescape")[::-1]

    def render(self, instance: dict) -> str:
        word = b"".join(SYLLABLES[k] for k in instance["parts"]).decode("latin-1")
        return f"Write the word {word} backwards, letter by letter.\nGive only the reversed word."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip() == reference else 0.0
