# expect: admitted
# odd but sound: `score` comes from a mixin class of the same file (not derived from Environment),
# and a module-level list is used read-only as a constant table.
"""Day of the week after a number of days (an equality oracle: modular arithmetic)."""

import random

from shared.environment import Environment

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class WordAnswerScoring:
    """Scores a one-word answer, ignoring case, surrounding quotes and a final period."""

    def score(self, instance: dict, reference: str, answer: str) -> float:
        text = answer.strip().strip("\"'`").strip()
        if text.endswith("."):
            text = text[:-1].strip()
        return 1.0 if text.lower() == str(reference).lower() else 0.0


class DayAfter(WordAnswerScoring, Environment):
    name = "day_after"
    description = "Which day of the week it is a given number of days after a given day."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: up to 20 days later. Difficulty 10: a sum of 10 spans of up to 10**6 days.
        spans = [rng.randint(1, 20 * 10 ** (difficulty // 2)) for _ in range(difficulty)]
        return {"start": rng.randrange(7), "spans": spans}

    def solve(self, instance: dict) -> str:
        return DAYS[(instance["start"] + sum(instance["spans"])) % 7]

    def render(self, instance: dict) -> str:
        spans = " + ".join(str(span) for span in instance["spans"])
        return (
            f"Today is {DAYS[instance['start']]}. Which day of the week will it be in "
            f"{spans} days?\n"
            "Write the final answer as the English name of the day, for example Friday."
        )
