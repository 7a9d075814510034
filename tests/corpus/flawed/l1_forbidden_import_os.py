# expect: L1
# why: imports `os` (not on the standard-library allowlist), here to join path-like strings.
# detail: 'os'
"""Normalise a file path (an equality oracle: string processing)."""

import os
import random

from shared.environment import Environment

PARTS = ("usr", "lib", "bin", "etc", "home", "tmp", "var", "opt", "src", "docs")


class NormalisePath(Environment):
    name = "normalise_path"
    description = "Simplify a Unix path containing '.' and '..' components."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        parts = [rng.choice(PARTS + (".", "..")) for _ in range(2 + 2 * difficulty)]
        return {"path": "/" + "/".join(parts)}

    def solve(self, instance: dict) -> str:
        return os.path.normpath(instance["path"])

    def render(self, instance: dict) -> str:
        return (
            f"Simplify the absolute Unix path {instance['path']} by resolving every '.' and "
            "'..' component ('..' at the root stays at the root).\n"
            "Write the final answer as the simplified path, starting with '/'."
        )

    def score(self, instance: dict, reference: str, answer: str) -> float:
        return 1.0 if answer.strip() == reference else 0.0
