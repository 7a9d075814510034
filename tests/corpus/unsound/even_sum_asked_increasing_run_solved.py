# expect: admitted
# unsound: the prompt asks for the sum of the even numbers, while solve returns the length of the
# longest strictly increasing subsequence (an embedded model's reviewer accepted this kind 3 of 3).
"""A list whose question and oracle disagree (passes L1-L5)."""

import bisect
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class EvenSum(Environment):
    name = "even_sum"
    description = "The sum of the even numbers in a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 99) for _ in range(4 + 3 * difficulty)]}

    def solve(self, instance: dict) -> int:
        tails: list[int] = []
        for number in instance["numbers"]:
            at = bisect.bisect_left(tails, number)
            if at == len(tails):
                tails.append(number)
            else:
                tails[at] = number
        return len(tails)

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(number) for number in instance["numbers"])
        return (
            f"Here is a list of integers:\n{numbers}\n\n"
            "What is the sum of the even numbers in the list?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
