# expect: L5
# why: a feasibility scorer whose constraint is so weak that most borrowed and perturbed answers
# are valid too (any non-empty set of even-valued positions), so it rejects fewer than half.
# detail: borrowed or perturbed
# trigger: none
"""Pick positions holding even values (a feasibility oracle with a trivial constraint)."""

import random
import re

from shared.environment import Environment


class EvenPositions(Environment):
    name = "even_positions"
    description = "Choose some positions of a list whose values are all even."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        size = 4 + 2 * difficulty
        numbers = [2 * rng.randint(1, 50) for _ in range(size)]
        for index in rng.sample(range(size), size // 4):
            numbers[index] += 1  # a quarter of the values are odd
        return {"numbers": numbers}

    def solve(self, instance: dict) -> list:
        return [i for i, value in enumerate(instance["numbers"]) if value % 2 == 0][:3]

    def render(self, instance: dict) -> str:
        listing = ", ".join(f"{i}: {value}" for i, value in enumerate(instance["numbers"]))
        return (
            f"Here are integers shown as index: value, indices from 0:\n{listing}\n"
            "Choose one or more indices whose values are all even; any such choice is accepted.\n"
            "Write the final answer as the chosen indices separated by commas."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        if not re.fullmatch(r"\s*[0-9]{1,4}(\s*,\s*[0-9]{1,4})*\s*", answer):
            return 0.0
        indices = [int(token) for token in answer.split(",")]
        numbers = instance["numbers"]
        if len(set(indices)) != len(indices) or any(i >= len(numbers) for i in indices):
            return 0.0
        return 1.0 if all(numbers[i] % 2 == 0 for i in indices) else 0.0
