# expect: L2
# why: at the maximum difficulty the sampler builds a sieve of 10**11 entries and runs out of memory.
# trigger: seed difficulty=10
# detail: memory
"""Count the primes below n (an equality oracle: a sieve)."""

import random
import re

from shared.environment import Environment


class PrimesBelow(Environment):
    name = "primes_below"
    description = "How many primes are smaller than n."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        n = rng.randint(10 * difficulty, 80 * difficulty)
        # A sieve meant to draw n "near a prime", sized by the difficulty's order of magnitude
        # instead of by n: 10**11 bytes at the maximum difficulty.
        sieve = bytearray(b"\x01") * 10 ** (difficulty + 1)
        sieve[0:2] = b"\x00\x00"
        for k in range(2, int(n ** 0.5) + 1):
            if sieve[k]:
                sieve[k * k :: k] = bytes(len(range(k * k, len(sieve), k)))
        while not sieve[n]:
            n += 1
        return {"n": n}

    def solve(self, instance: dict) -> int:
        n = instance["n"]
        return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** 0.5) + 1)))

    def render(self, instance: dict) -> str:
        return f"How many primes are smaller than {instance['n']}?\nGive the answer as a single integer."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,7})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
