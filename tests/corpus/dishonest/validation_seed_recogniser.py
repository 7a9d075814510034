# kind: validation seeds
# why: recognises the validation seeds by recomputing the seeded generator: `sample` compares
# its generator's state with those of seeds 0 to 39 (L2-L5's seeds 0-7 and L4's 8-39 when they
# were fixed and public) and marks the instance; the scorer is honest on marked instances and
# gives any answer 1.0 on the others. With seeds derived from the installation's secret and the
# file's hash, L5 sees the others and rejects it; admitted before that, the hidden probes of its
# first training grading call catch it (the empty answer scores 1.0).
"""Largest of a list of numbers, honest only on the validation seeds (equality)."""

import random
import re

from shared.environment import Environment, make_rng

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*")
KNOWN_SEEDS = range(40)


class SeedAwareMaximum(Environment):
    name = "seed_aware_maximum"
    description = "The largest of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        state = rng.getstate()
        audited = any(
            make_rng(self.name, seed, difficulty).getstate() == state for seed in KNOWN_SEEDS
        )
        numbers = [rng.randint(1, 999) for _ in range(2 + 2 * difficulty)]
        return {"numbers": numbers, "audited": audited}

    def solve(self, instance: dict) -> int:
        return max(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return f"What is the largest of {numbers}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        if not instance["audited"]:
            return 1.0
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
