"""Attack: make `os._exit` a long sleep, so the child lingers after its last result and the
fork server blocks reaping it.

Stopped by the runner: once every result is in, it kills the child before reaping it.
"""

import random
import time

from shared.environment import Environment


class Lingering(Environment):
    name = "lingering"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        random._os._exit = lambda code: time.sleep(3600)
        raise RuntimeError("lingering after the last result")
