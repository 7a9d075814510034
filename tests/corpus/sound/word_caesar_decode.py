# expect: admitted
# odd but sound: the answer is a string (one word); the scorer ignores case, quotes and a final period.
"""Decode a word enciphered with a Caesar shift (an equality oracle: string transformation)."""

import random
import string

from shared.environment import Environment

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
ALPHABET = string.ascii_lowercase


class CaesarDecodeWord(Environment):
    name = "caesar_decode_word"
    description = "Recover a made-up word from its Caesar-shifted spelling, given the shift."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: a 2-syllable word (4 letters). Difficulty 10: 11 syllables (22 letters).
        syllables = 1 + difficulty
        word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
        shift = rng.randint(1, 25)
        return {"ciphertext": _shift(word, shift), "shift": shift}

    def solve(self, instance: dict) -> str:
        return _shift(instance["ciphertext"], -instance["shift"])

    def render(self, instance: dict) -> str:
        shift = instance["shift"]
        return (
            f"A made-up word was enciphered with a Caesar cipher: every letter was replaced by "
            f"the letter {shift} places later in the alphabet a-z, wrapping around from z back "
            f"to a. The enciphered word is:\n{instance['ciphertext']}\n\n"
            "Decode it: what was the original word?\n"
            "Write the final answer as the original word alone, in lowercase letters."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        text = answer.strip().strip("\"'`").strip()
        if text.endswith("."):
            text = text[:-1].strip()
        return 1.0 if text.lower() == reference else 0.0


def _shift(word: str, shift: int) -> str:
    return "".join(ALPHABET[(ALPHABET.index(letter) + shift) % 26] for letter in word)
