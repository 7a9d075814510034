# expect: admitted
# odd but sound: a feasibility task with many valid answers, so a borrowed or perturbed answer is
# often still valid (about 1 in m); the scorer still rejects far more than half of those probes.
"""Pigeonhole pairs: two positions whose values leave the same remainder modulo m.

A feasibility environment. The list is longer than m, so by the pigeonhole principle a valid
pair always exists; the oracle returns the first pair it finds, and the scorer checks the
constraint, so every valid pair scores 1.0.
"""

import random
import re

from shared.environment import Environment

PAIR = re.compile(r"\s*\(?\s*([0-9]{1,6})\s*,\s*([0-9]{1,6})\s*\)?\s*\.?\s*")


class SameRemainderPair(Environment):
    name = "same_remainder_pair"
    description = "Find two positions in a list whose values have the same remainder modulo m."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: m = 2 and 5 numbers up to 50. Difficulty 10: m = 3, 15 numbers up to 320.
        modulus = 2 + (difficulty - 1) // 6
        size = modulus + 2 + difficulty
        high = 20 + 30 * difficulty
        return {"numbers": [rng.randint(1, high) for _ in range(size)], "modulus": modulus}

    def solve(self, instance: dict) -> list:
        numbers, modulus = instance["numbers"], instance["modulus"]
        first: dict = {}
        for index, value in enumerate(numbers):
            remainder = value % modulus
            if remainder in first:
                return [first[remainder], index]
            first[remainder] = index
        return []  # unreachable: there are more numbers than remainders

    def render(self, instance: dict) -> str:
        numbers, modulus = instance["numbers"], instance["modulus"]
        listing = ", ".join(f"{i}: {value}" for i, value in enumerate(numbers))
        return (
            f"Here are {len(numbers)} positive integers, each shown as index: value, with "
            f"indices starting at 0:\n{listing}\n\n"
            f"Find two different indices i and j whose values leave the same remainder when "
            f"divided by {modulus}. Such a pair always exists; any valid pair is accepted.\n\n"
            "Write the final answer as the two indices separated by a comma, for example 3, 7."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        match = PAIR.fullmatch(answer)
        if match is None:
            return 0.0
        i, j = int(match.group(1)), int(match.group(2))
        numbers, modulus = instance["numbers"], instance["modulus"]
        if i == j or i >= len(numbers) or j >= len(numbers):
            return 0.0
        return 1.0 if numbers[i] % modulus == numbers[j] % modulus else 0.0
