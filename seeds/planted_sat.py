"""Planted 3-SAT: find a true/false assignment that satisfies every clause of a formula.

A feasibility environment. The sampler draws a hidden assignment first and keeps only clauses
it satisfies, so the formula is always satisfiable; the planted assignment is kept in the
instance and serves as the reference. The scorer checks every clause, so any satisfying
assignment scores 1.0.
"""

import random
import re

from shared.environment import Environment


class PlantedSat(Environment):
    name = "planted_sat"
    description = "Find an assignment of boolean variables that satisfies a 3-CNF formula."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 3 variables, 4 clauses. Difficulty 10: 21 variables at a clause ratio
        # of 4.2, near the satisfiability threshold.
        size = 1 + 2 * difficulty
        count = int((1.5 + 0.3 * (difficulty - 1)) * size)
        planted = [rng.randint(0, 1) for _ in range(size)]
        clauses: list = []
        while len(clauses) < count:
            variables = sorted(rng.sample(range(1, size + 1), 3))
            clause = [v if rng.random() < 0.5 else -v for v in variables]
            if _satisfied(clause, planted) and clause not in clauses:
                clauses.append(clause)
        return {"size": size, "clauses": clauses, "planted": planted}

    def solve(self, instance: dict) -> list:
        return list(instance["planted"])

    def render(self, instance: dict) -> str:
        size = instance["size"]
        lines = "\n".join(
            f"{number}. " + " OR ".join(_literal(lit) for lit in clause)
            for number, clause in enumerate(instance["clauses"], 1)
        )
        return (
            f"There are {size} boolean variables x1 to x{size}. Every one of the following "
            f"{len(instance['clauses'])} clauses must be true, where a clause is true when at "
            f"least one of its three parts is true:\n{lines}\n\n"
            f"Find values for the variables that make all clauses true. Such values exist; any "
            f"valid assignment is accepted.\n\n"
            f"Write the final answer as {size} values separated by commas, 1 for true and 0 for "
            f"false: the value of x1 first, then x2, and so on up to x{size}."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        values = _parse_int_list(answer)
        if values is None or len(values) != instance["size"]:
            return 0.0
        if any(value not in (0, 1) for value in values):
            return 0.0
        return 1.0 if all(_satisfied(c, values) for c in instance["clauses"]) else 0.0


def _satisfied(clause: list, values: list) -> bool:
    """A literal v means x_v is true, -v means x_v is false; values[v - 1] is 1 or 0."""
    return any((values[abs(lit) - 1] == 1) == (lit > 0) for lit in clause)


def _literal(lit: int) -> str:
    return f"x{lit}" if lit > 0 else f"NOT x{-lit}"


def _parse_int_list(text: str) -> list | None:
    """Non-negative integers separated by commas, or None when the text is anything else."""
    if len(text) > 10_000:
        return None
    if not re.fullmatch(r"\s*[0-9]{1,6}(\s*,\s*[0-9]{1,6})*\s*", text):
        return None
    return [int(token) for token in text.split(",")]
