"""Graph colouring: give every vertex one of k colours so that no edge joins two equal colours.

A feasibility environment. The sampler plants a colouring first and then draws edges only
between vertices of different planted colours, so a proper colouring always exists; the
planted colouring is kept in the instance and serves as the reference. The scorer checks
every edge, so any proper colouring scores 1.0.
"""

import random
import re

from shared.environment import Environment


class GraphColoring(Environment):
    name = "graph_coloring"
    description = "Colour the vertices of a graph with k colours so that adjacent vertices differ."
    oracle = "feasibility"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 4 vertices, 3 edges. Difficulty 10: 31 vertices at average degree
        # about 4.4, close to where random 3-colouring is hardest.
        colors = 3
        size = 3 * difficulty + 1
        order = list(range(size))
        rng.shuffle(order)
        planted = [0] * size
        for position, vertex in enumerate(order):
            planted[vertex] = position % colors + 1  # every colour is used
        allowed = [
            [u, v] for u in range(size) for v in range(u + 1, size) if planted[u] != planted[v]
        ]
        average_degree = 1.3 + 0.35 * (difficulty - 1)
        count = min(len(allowed), round(average_degree * size / 2))
        edges = sorted(rng.sample(allowed, count))
        return {"size": size, "colors": colors, "edges": edges, "planted": planted}

    def solve(self, instance: dict) -> list:
        return list(instance["planted"])

    def render(self, instance: dict) -> str:
        size, colors = instance["size"], instance["colors"]
        listing = ", ".join(f"{u}-{v}" for u, v in instance["edges"])
        return (
            f"An undirected graph has {size} vertices, numbered 0 to {size - 1}, and "
            f"{len(instance['edges'])} edges (u-v joins vertices u and v):\n{listing}\n\n"
            f"Give every vertex a colour from 1 to {colors} so that the two ends of every edge "
            f"have different colours. Such a colouring exists; any valid one is accepted.\n\n"
            f"Write the final answer as {size} colours separated by commas: the colour of "
            f"vertex 0 first, then vertex 1, and so on up to vertex {size - 1}."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        coloring = _parse_int_list(answer)
        if coloring is None or len(coloring) != instance["size"]:
            return 0.0
        if any(not 1 <= color <= instance["colors"] for color in coloring):
            return 0.0
        proper = all(coloring[u] != coloring[v] for u, v in instance["edges"])
        return 1.0 if proper else 0.0


def _parse_int_list(text: str) -> list | None:
    """Non-negative integers separated by commas, or None when the text is anything else."""
    if len(text) > 10_000:
        return None
    if not re.fullmatch(r"\s*[0-9]{1,6}(\s*,\s*[0-9]{1,6})*\s*", text):
        return None
    return [int(token) for token in text.split(",")]
