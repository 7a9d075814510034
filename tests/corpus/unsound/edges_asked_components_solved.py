# expect: admitted
# unsound: the prompt asks how many edges the graph has, while solve returns the number of its
# connected components.
"""A graph whose question and oracle disagree (passes L1-L5)."""

import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,9})\s*\.?\s*")


class GraphEdges(Environment):
    name = "graph_edges"
    description = "Count the edges of an undirected graph given as a list of pairs."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        nodes = 4 + 2 * difficulty
        pairs = set()
        for _ in range(nodes - 1):
            a, b = rng.sample(range(nodes), 2)
            pairs.add((min(a, b), max(a, b)))
        return {"nodes": nodes, "edges": [list(pair) for pair in sorted(pairs)]}

    def solve(self, instance: dict) -> int:
        parent = list(range(instance["nodes"]))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for a, b in instance["edges"]:
            parent[find(a)] = find(b)
        return len({find(x) for x in range(instance["nodes"])})

    def render(self, instance: dict) -> str:
        edges = "; ".join(f"{a}-{b}" for a, b in instance["edges"])
        return (
            f"An undirected graph has the nodes 0 to {instance['nodes'] - 1} and these edges:\n"
            f"{edges}\n\n"
            "How many edges does the graph have?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        match = INTEGER.fullmatch(answer)
        return 1.0 if match is not None and int(match.group(1)) == reference else 0.0
