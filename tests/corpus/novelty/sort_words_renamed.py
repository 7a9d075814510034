"""Order invented words by size, then alphabetically (a near-copy of the sort_words seed:
identifiers renamed, the prompt reworded, the same algorithm)."""

import random

from shared.environment import Environment

CONSONANT_LETTERS = "bdfgklmnprstvz"
VOWEL_LETTERS = "aeiou"


class OrderInventedTokens(Environment):
    name = "order_invented_tokens"
    description = "Order a list of words by length, with ties broken alphabetically."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        total = 2 + 2 * difficulty  # 4 words at difficulty 1, 22 at difficulty 10
        longest = 1 + (difficulty + 1) // 3
        tokens: list[str] = []
        while len(tokens) < total:
            token = _invent_token(rng, longest)
            if token not in tokens:
                tokens.append(token)
        while tokens == self.solve({"words": tokens}):
            rng.shuffle(tokens)  # never show the words already sorted
        return {"words": tokens}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"], key=lambda token: (len(token), token))

    def render(self, instance: dict) -> str:
        listed = ", ".join(instance["words"])
        return (
            f"The following {len(instance['words'])} words are given: {listed}.\n"
            "Put them in order of length, shortest first; words of equal length are ordered "
            "alphabetically.\n"
            "Answer with the words in sorted order as a comma-separated list, "
            "for example: ab, ba, abc"
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        cleaned = answer.strip()
        if cleaned.endswith("."):
            cleaned = cleaned[:-1]
        parts = [part.strip() for part in cleaned.split(",")]
        return 1.0 if parts == reference else 0.0


def _invent_token(rng: random.Random, longest: int) -> str:
    """A pronounceable word of 1..longest syllables, sometimes ending in a consonant."""
    count = rng.randint(1, longest)
    token = "".join(rng.choice(CONSONANT_LETTERS) + rng.choice(VOWEL_LETTERS) for _ in range(count))
    if rng.random() < 0.5:
        token += rng.choice(CONSONANT_LETTERS)
    return token
