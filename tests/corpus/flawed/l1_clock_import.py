# expect: L1
# why: imports `time` (clock use is forbidden; `time` is not on the allowlist).
# detail: 'time'
"""Seconds between two clock times (an equality oracle: arithmetic)."""

import random
import re
import time

from shared.environment import Environment


class SecondsBetween(Environment):
    name = "seconds_between"
    description = "How many seconds pass between two times of the same day."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        start = rng.randint(0, 40_000)
        gap = rng.randint(1, 4_000 * difficulty)
        return {"start": start, "end": start + gap}

    def solve(self, instance: dict) -> int:
        return instance["end"] - instance["start"]

    def render(self, instance: dict) -> str:
        def clock(seconds: int) -> str:
            return time.strftime("%H:%M:%S", time.gmtime(seconds))

        return (
            f"How many seconds pass between {clock(instance['start'])} and "
            f"{clock(instance['end'])} on the same day?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,7})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
