"""Attack: raise the address-space limit, then allocate without bound.

Stopped by RLIMIT_AS (the hard limit cannot be raised): MemoryError, reported as `memory`.
"""

import random

from shared.environment import Environment


class BigTable(Environment):
    name = "big_table"
    description = "Look a value up in a table."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"key": rng.randint(0, 99)}

    def solve(self, instance: dict) -> int:
        return instance["key"] * 3

    def render(self, instance: dict) -> str:
        return f"What is 3 times {instance['key']}?"

    def score(self, instance: dict, reference: int, answer: str) -> float:
        resource = random.__builtins__["__import__"]("resource")
        try:
            unlimited = resource.RLIM_INFINITY
            resource.setrlimit(resource.RLIMIT_AS, (unlimited, unlimited))
        except (ValueError, OSError):
            pass
        table = []
        while True:
            table.append(bytearray(64 << 20))
