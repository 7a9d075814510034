"""Attack: flood stdout and stderr, then return a result far over the output cap.

Stopped by the runner: the child's stdout and stderr are /dev/null, and a result line over
the cap kills the child (`output`).
"""

import random
import sys

from shared.environment import Environment


class Chatty(Environment):
    name = "chatty"
    description = "Return a long word."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        chunk = "y" * (1 << 20)
        for _ in range(10):
            print(chunk)
            sys.__stdout__.write(chunk)
            sys.__stderr__.write(chunk)
            random._os.write(1, chunk.encode())
            random._os.write(2, chunk.encode())
        return {"word": "x" * (4 << 20)}

    def solve(self, instance: dict) -> str:
        return instance["word"]

    def render(self, instance: dict) -> str:
        return "Repeat the word."

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return float(answer == reference)
