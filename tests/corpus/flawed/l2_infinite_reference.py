# expect: L2
# why: the oracle returns math.inf when the target cannot be reached, and infinity is not JSON.
# detail: reference
"""Shortest path length in a sparse directed graph (an equality oracle: breadth-first search)."""

import collections
import math
import random
import re

from shared.environment import Environment


class ShortestHops(Environment):
    name = "shortest_hops"
    description = "The fewest edges on a path from vertex 0 to the last vertex of a directed graph."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        size = 4 + difficulty
        edges = sorted({(rng.randrange(size), rng.randrange(size)) for _ in range(size)})
        return {"size": size, "edges": [[u, v] for u, v in edges if u != v]}

    def solve(self, instance: dict) -> float:
        size = instance["size"]
        adjacent = collections.defaultdict(list)
        for u, v in instance["edges"]:
            adjacent[u].append(v)
        distance = {0: 0}
        queue = collections.deque([0])
        while queue:
            u = queue.popleft()
            for v in adjacent[u]:
                if v not in distance:
                    distance[v] = distance[u] + 1
                    queue.append(v)
        return distance.get(size - 1, math.inf)  # bug: inf is not JSON (should be e.g. -1)

    def render(self, instance: dict) -> str:
        edges = ", ".join(f"{u}->{v}" for u, v in instance["edges"])
        return (
            f"A directed graph has vertices 0 to {instance['size'] - 1} and edges {edges}.\n"
            f"What is the fewest number of edges on a path from 0 to {instance['size'] - 1}? "
            "Write inf if there is no such path.\nGive the answer as a single integer or inf."
        )

    def score(self, instance: dict, reference: float, answer: str) -> float:
        text = answer.strip().lower()
        if text == "inf":
            return 1.0 if reference == math.inf else 0.0
        match = re.fullmatch(r"[0-9]{1,4}", text)
        return 1.0 if match is not None and int(text) == reference else 0.0
