# expect: L3
# why: the scorer gives a wrong answer random partial credit drawn from random.SystemRandom, which
# no seed fixes: the same answer gets different scores in two processes.
# detail: different scores
"""Sort integers in increasing order (an equality oracle: sorting), with random partial credit."""

import random
import re

from shared.environment import Environment

INTEGER_LIST = re.compile(r"\s*(-?[0-9]{1,6}(?:\s*,\s*-?[0-9]{1,6})*)\s*")


class SortAscendingJitter(Environment):
    name = "sort_ascending_jitter"
    description = "Sort a list of integers from smallest to largest; partial credit per position."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        numbers = [rng.randint(1, 30 * difficulty) for _ in range(1 + 3 * difficulty)]
        while numbers == sorted(numbers):
            rng.shuffle(numbers)
        return {"numbers": numbers}

    def solve(self, instance: dict) -> list:
        return sorted(instance["numbers"])

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Sort these {len(instance['numbers'])} integers from the smallest to the largest, "
            f"keeping repeated values:\n{numbers}\n\n"
            "Write the sorted numbers separated by commas, smallest first."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        match = INTEGER_LIST.fullmatch(answer)
        if match is None:
            return 0.0
        given = [int(token) for token in match.group(1).split(",")]
        if given == reference:
            return 1.0
        right = sum(1 for a, b in zip(given, reference) if a == b)
        # bug: a jitter from the operating system's randomness, which no seed fixes
        jitter = random.SystemRandom().uniform(0.5, 0.99)
        return jitter * right / max(len(given), len(reference))
