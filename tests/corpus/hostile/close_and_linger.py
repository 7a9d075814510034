"""Attack: close the result pipe, then linger, so the fork server waits for a child that never
exits (a sleep: the CPU-time limit never fires) and the host gives up on the whole server.

Stopped by the runner: at end of file on the pipe it kills the child before reaping it
(`crash`, at once).
"""

import random
import time

from shared.environment import Environment


class Patient(Environment):
    name = "patient"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        random._os.closerange(3, 1024)
        time.sleep(3600)
        return 1.0
