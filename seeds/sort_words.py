"""Sort made-up words by length, then alphabetically (an equality oracle: sorting)."""

import random

from shared.environment import Environment

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


class SortWords(Environment):
    name = "sort_words"
    description = "Sort a list of words by length, breaking ties alphabetically."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        count = 2 + 2 * difficulty  # 4 words at difficulty 1, 22 at difficulty 10
        max_syllables = 1 + (difficulty + 1) // 3
        words: list[str] = []
        while len(words) < count:
            word = _make_word(rng, max_syllables)
            if word not in words:
                words.append(word)
        while words == self.solve({"words": words}):
            rng.shuffle(words)  # never show the words already in order
        return {"words": words}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"], key=lambda word: (len(word), word))

    def render(self, instance: dict) -> str:
        words = ", ".join(instance["words"])
        return (
            f"Here are {len(instance['words'])} words: {words}.\n"
            "Sort them by length, shortest first; words of the same length go in "
            "alphabetical order.\n"
            "Give the answer as a comma-separated list of the words in sorted order, "
            "for example: ab, ba, abc"
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        text = answer.strip()
        if text.endswith("."):
            text = text[:-1]
        items = [item.strip() for item in text.split(",")]
        return 1.0 if items == reference else 0.0


def _make_word(rng: random.Random, max_syllables: int) -> str:
    """A pronounceable word of 1..max_syllables syllables, sometimes with a final consonant."""
    syllables = rng.randint(1, max_syllables)
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
    if rng.random() < 0.5:
        word += rng.choice(CONSONANTS)
    return word
