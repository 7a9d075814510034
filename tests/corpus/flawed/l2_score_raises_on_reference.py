# expect: L2
# why: the scorer parses the answer with json.loads, but answer_text writes the list as "3, 8, 1"
# (no brackets), so scoring the instance's own reference answer raises.
# trigger: seed difficulty=1
# detail: JSONDecodeError
"""Running maximum of a list (an equality oracle)."""

import json
import random

from shared.environment import Environment


class RunningMaximum(Environment):
    name = "running_maximum"
    description = "The running maximum of a list of integers."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"numbers": [rng.randint(1, 20 * difficulty) for _ in range(3 + 2 * difficulty)]}

    def solve(self, instance: dict) -> list:
        out, best = [], None
        for n in instance["numbers"]:
            best = n if best is None else max(best, n)
            out.append(best)
        return out

    def render(self, instance: dict) -> str:
        numbers = ", ".join(str(n) for n in instance["numbers"])
        return (
            f"For the list {numbers}, give the running maximum: at each position, the largest "
            "value seen so far.\nWrite the final answer as a comma-separated list of integers."
        )

    def score(self, instance: dict, reference: list, answer: str) -> float:
        return 1.0 if json.loads(answer) == reference else 0.0
