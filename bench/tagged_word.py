"""bench/bench_async.py's environment: say a made-up word that the prompt shows in answer tags.

The small embedded model (smollm2-135m-instruct) answered none of 320 completions of the ten
seeds at difficulty 1 in the <answer> format (max 64 tokens): its groups have no reward
variance, and the learner trains nothing. Here it puts an answer in tags about one time in
ten; any answer in tags earns half the reward and the right word all of it, so a fair share of
groups of 8 mix format errors (0) with answers (0.5 or 1): the learner gets steps to time.
"""

import random

from shared.environment import Environment


class TaggedWord(Environment):
    name = "tagged_word"
    description = "Say a made-up word shown between answer tags."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        letters = "bcdfghjklmnpqrstvwxz"
        vowels = "aeiou"
        syllables = 1 + difficulty
        return {"word": "".join(rng.choice(letters) + rng.choice(vowels) for _ in range(syllables))}

    def solve(self, instance: dict) -> str:
        return instance["word"]

    def render(self, instance: dict) -> str:
        return f"Say <answer>{instance['word']}</answer>."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip().lower() == reference else 0.5
