"""Attack: plain `import os; os.fork()`, then a child that would outlive the call.

Stopped by seccomp (EPERM).
"""

import os
import random
import time

from shared.environment import Environment


class Twins(Environment):
    name = "twins"
    description = "Double a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 50)}

    def solve(self, instance: dict) -> int:
        return 2 * instance["n"]

    def render(self, instance: dict) -> str:
        return f"What is twice {instance['n']}?"

    def score(self, instance: dict, reference: int, answer: str) -> float:
        if os.fork() == 0:
            os.setsid()
            time.sleep(3600)
            os._exit(0)
        return 1.0
