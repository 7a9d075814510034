"""Planted subset sum: pick numbers from a list so that they add up to a target.

A feasibility environment. The sampler plants a subset and sets the target to its sum, so a
solution always exists; the planted indices are kept in the instance and serve as the
reference. The scorer checks the constraints, so every valid subset scores 1.0.
"""

import random
import re

from shared.environment import Environment


class PlantedSubsetSum(Environment):
    name = "planted_subset_sum"
    description = "Choose distinct positions in a list of integers whose values sum to a target."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 4 numbers up to 20. Difficulty 10: 22 numbers up to 1010.
        size = 2 + 2 * difficulty
        high = 10 + 10 * difficulty * difficulty
        numbers = rng.sample(range(1, high + 1), size)
        count = rng.randint(2, size // 2 + 1)
        planted = sorted(rng.sample(range(size), count))
        target = sum(numbers[i] for i in planted)
        return {"numbers": numbers, "target": target, "planted": planted}

    def solve(self, instance: dict) -> list:
        return list(instance["planted"])

    def render(self, instance: dict) -> str:
        numbers = instance["numbers"]
        listing = ", ".join(f"{i}: {value}" for i, value in enumerate(numbers))
        return (
            f"Here are {len(numbers)} positive integers, each shown as index: value, "
            f"with indices starting at 0:\n{listing}\n\n"
            f"Choose some of them (each index at most once) whose values add up to exactly "
            f"{instance['target']}. At least one such choice exists; any valid choice is "
            f"accepted.\n\n"
            f"Write the final answer as the chosen 0-based indices, separated by commas, in any "
            f"order (indices only, not the values)."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        indices = _parse_int_list(answer)
        numbers = instance["numbers"]
        if indices is None or len(set(indices)) != len(indices):
            return 0.0
        if any(i >= len(numbers) for i in indices):
            return 0.0
        return 1.0 if sum(numbers[i] for i in indices) == instance["target"] else 0.0


def _parse_int_list(text: str) -> list | None:
    """Non-negative integers separated by commas, or None when the text is anything else."""
    if len(text) > 10_000:
        return None
    if not re.fullmatch(r"\s*[0-9]{1,6}(\s*,\s*[0-9]{1,6})*\s*", text):
        return None
    return [int(token) for token in text.split(",")]
