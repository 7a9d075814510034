"""Connected components: count the pieces an undirected graph falls into.

An equality environment. The sampler draws random edges between numbered vertices; the oracle
counts components with a breadth-first search from every unvisited vertex. Isolated vertices
count as components of their own.
"""

import random
import re
from collections import deque

from shared.environment import Environment


class CountConnectedComponents(Environment):
    name = "count_connected_components"
    description = "Count the connected components of an undirected graph given as an edge list."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        # Difficulty 1: 4 vertices, 1-3 edges. Difficulty 10: 58 vertices, 19-57 edges.
        size = 6 * difficulty - 2
        count = rng.randint(size // 3, size - 1)
        edges: list = []
        while len(edges) < count:
            u, v = sorted(rng.sample(range(size), 2))
            if [u, v] not in edges:
                edges.append([u, v])
        return {"size": size, "edges": edges}

    def solve(self, instance: dict) -> int:
        neighbours: list = [[] for _ in range(instance["size"])]
        for u, v in instance["edges"]:
            neighbours[u].append(v)
            neighbours[v].append(u)
        seen = [False] * instance["size"]
        components = 0
        for start in range(instance["size"]):
            if seen[start]:
                continue
            components += 1
            seen[start] = True
            queue = deque([start])
            while queue:
                for other in neighbours[queue.popleft()]:
                    if not seen[other]:
                        seen[other] = True
                        queue.append(other)
        return components

    def render(self, instance: dict) -> str:
        size = instance["size"]
        listing = ", ".join(f"{u}-{v}" for u, v in instance["edges"])
        return (
            f"An undirected graph has {size} vertices, numbered 0 to {size - 1}, and "
            f"{len(instance['edges'])} edges (u-v joins vertices u and v):\n{listing}\n\n"
            f"How many connected components does the graph have? Two vertices are in the same "
            f"component when a path of edges joins them; a vertex with no edges is a component "
            f"on its own.\n\n"
            f"Write the final answer as a single integer."
        )

    def score(self, instance: dict, reference: object, answer: str) -> float:
        if not re.fullmatch(r"[0-9]{1,9}", answer.strip()):
            return 0.0
        return 1.0 if int(answer.strip()) == reference else 0.0
