"""Levenshtein distance between two strings (an equality oracle: dynamic programming)."""

import random
import re
import string

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class EditDistance(Environment):
    name = "edit_distance"
    description = "Minimum number of single-character edits turning one string into another."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        alphabet = string.ascii_lowercase[: 3 + difficulty // 3]
        length = rng.randint(difficulty + 2, 2 * difficulty + 3)  # 3-5 at 1, 12-23 at 10
        source = [rng.choice(alphabet) for _ in range(length)]
        target = list(source)
        for _ in range(rng.randint(1, max(3, length // 2))):  # a few random edits
            position = rng.randrange(len(target) + 1)
            kind = rng.choice(("insert", "delete", "substitute"))
            if kind == "insert" or position == len(target):
                target.insert(position, rng.choice(alphabet))
            elif kind == "delete" and len(target) > 1:
                del target[position]
            else:
                target[position] = rng.choice(alphabet.replace(target[position], ""))
        return {"source": "".join(source), "target": "".join(target)}

    def solve(self, instance: dict) -> int:
        source, target = instance["source"], instance["target"]
        # previous[j] is the distance between the prefix of source so far and target[:j].
        previous = list(range(len(target) + 1))
        for i, a in enumerate(source, 1):
            current = [i]
            for j, b in enumerate(target, 1):
                current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
            previous = current
        return previous[-1]

    def render(self, instance: dict) -> str:
        return (
            f'What is the edit (Levenshtein) distance between "{instance["source"]}" and '
            f'"{instance["target"]}"? That is the minimum number of single-character '
            "insertions, deletions and substitutions needed to turn the first string into the "
            "second.\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse_int(answer) == reference else 0.0


def _parse_int(text: str) -> int | None:
    """The integer that the whole text spells (an optional trailing period allowed), else None."""
    match = INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None
