# expect: L2
# why: the instance holds tuples (edges as (u, v)); a JSON round trip turns them into lists.
# detail: round trip
"""Degree of a vertex in an undirected graph (an equality oracle)."""

import random
import re

from shared.environment import Environment


class VertexDegree(Environment):
    name = "vertex_degree"
    description = "How many edges touch a given vertex of an undirected graph."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        size = 3 + difficulty
        pairs = [(u, v) for u in range(size) for v in range(u + 1, size)]
        edges = rng.sample(pairs, len(pairs) // 2)
        return {"size": size, "edges": edges, "vertex": rng.randrange(size)}

    def solve(self, instance: dict) -> int:
        return sum(1 for u, v in instance["edges"] if instance["vertex"] in (u, v))

    def render(self, instance: dict) -> str:
        edges = ", ".join(f"{u}-{v}" for u, v in instance["edges"])
        return (
            f"An undirected graph has vertices 0 to {instance['size'] - 1} and edges {edges}.\n"
            f"How many edges touch vertex {instance['vertex']}?\nGive the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = re.fullmatch(r"\s*([0-9]{1,4})\s*", answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
