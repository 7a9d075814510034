# expect: L3
# why: the sampler lists the words of a set of strings in set iteration order, which depends on
# the hash seed: two processes with different PYTHONHASHSEED give different instances.
# detail: hash seed
"""Position of a word in a list (an equality oracle)."""

import random
import re

from shared.environment import Environment

VOCABULARY = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet", "juniper",
    "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble", "quartz", "raven", "summit",
    "tundra", "umber", "valley", "willow", "yarrow", "zephyr",
)


class WordPosition(Environment):
    name = "word_position"
    description = "The 1-based position of a given word in a list of distinct words."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        chosen = set()
        while len(chosen) < 4 + 2 * difficulty:
            chosen.add(rng.choice(VOCABULARY))
        words = list(chosen)  # bug: set order of strings varies with the hash seed
        return {"words": words, "target": words[rng.randrange(len(words))]}

    def solve(self, instance: dict) -> int:
        return instance["words"].index(instance["target"]) + 1

    def render(self, instance: dict) -> str:
        return (
            f"Here is a list of words: {', '.join(instance['words'])}.\n"
            f"At which position (counting from 1) does the word '{instance['target']}' appear?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,3})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
