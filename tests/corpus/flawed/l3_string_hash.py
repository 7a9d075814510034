# expect: L3
# why: the sampler derives a number from hash() of a string, which differs between processes with
# different hash seeds.
# detail: hash seed
"""Checksum of a word: the sum of its letter values modulo m (an equality oracle)."""

import random
import re
import string

from shared.environment import Environment


class WordChecksum(Environment):
    name = "word_checksum"
    description = "The sum of the alphabet positions of a word's letters, modulo m."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(3 + 2 * difficulty))
        modulus = 7 + hash(word) % (10 * difficulty)  # bug: str hashes are salted per process
        return {"word": word, "modulus": modulus}

    def solve(self, instance: dict) -> int:
        total = sum(string.ascii_lowercase.index(c) + 1 for c in instance["word"])
        return total % instance["modulus"]

    def render(self, instance: dict) -> str:
        return (
            f"Give each letter its position in the alphabet (a=1, ..., z=26). What is the sum of "
            f"the letter values of '{instance['word']}', modulo {instance['modulus']}?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
