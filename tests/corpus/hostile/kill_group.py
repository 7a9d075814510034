"""Attack: SIGKILL the whole process group, which holds the fork server and this child.

Landlock scoping keeps the signal from the server; it only kills the child itself (`crash`).
"""

import os
import random
import signal

from shared.environment import Environment


class Group(Environment):
    name = "group_signal"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        try:
            os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)
        return 1.0
