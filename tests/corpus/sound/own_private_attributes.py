# expect: admitted
# odd but sound: private attributes and methods of its own, read through self and cls, in
# methods and in a lambda inside one, a name-mangled helper and a class-level private table.
"""Sort a list of words by a private letter ranking (an equality oracle)."""

import random
import re

from shared.environment import Environment

WORD = re.compile(r"[a-z]+")


class RankedWords(Environment):
    name = "ranked_words"
    description = "Sort words by the sum of their letters' ranks, ties alphabetically."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10
    _LETTERS = "abcdefghijklmnopqrstuvwxyz"

    def __init__(self) -> None:
        self._ranks = {letter: k + 1 for k, letter in enumerate(self._LETTERS)}

    @classmethod
    def _alphabet(cls) -> str:
        return cls._LETTERS

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        letters = self._alphabet()[: 6 + 2 * difficulty]
        words = [
            "".join(rng.choice(letters) for _ in range(rng.randint(2, 5)))
            for _ in range(2 + difficulty)
        ]
        return {"words": words}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"], key=lambda word: (self.__weight(word), word))

    def __weight(self, word: str) -> int:
        return sum(self._ranks[letter] for letter in word)

    def render(self, instance: dict) -> str:
        return (
            "Give each letter its rank in the alphabet (a = 1, b = 2, ...). Sort these words by "
            "the sum of their letters' ranks, smallest first, and break ties alphabetically: "
            f"{', '.join(instance['words'])}.\n"
            "Give the sorted words separated by commas."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        return 1.0 if WORD.findall(answer.lower()) == reference else 0.0
