"""Shortest path in a grid with walls (an equality oracle: graph search, BFS)."""

import collections
import random
import re

from shared.environment import Environment

INTEGER = re.compile(r"\s*([+-]?[0-9]{1,30})\s*\.?\s*")


class GridShortestPath(Environment):
    name = "grid_shortest_path"
    description = "Fewest up/down/left/right steps from S to T in a grid with walls."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        side = 2 + 2 * difficulty  # 4x4 at difficulty 1, 22x22 at difficulty 10
        density = 0.2 + 0.01 * difficulty
        cells = [(r, c) for r in range(side) for c in range(side)]
        start, target = rng.sample(cells, 2)
        walls = [cell for cell in cells if cell not in (start, target) and rng.random() < density]
        while True:
            grid = _draw(side, walls, start, target)
            if _distance(grid) >= 0:
                return {"grid": grid}
            walls.remove(rng.choice(walls))  # open one wall at a time until T is reachable

    def solve(self, instance: dict) -> int:
        return _distance(instance["grid"])

    def render(self, instance: dict) -> str:
        grid = "\n".join(instance["grid"])
        return (
            "In the grid below, '.' is an open cell, '#' is a wall, S is the start and T is "
            "the target:\n"
            f"{grid}\n"
            "Each step moves to an adjacent open cell up, down, left or right (no diagonal "
            "moves, no leaving the grid, S and T count as open). What is the smallest number of "
            "steps needed to go from S to T?\n"
            "Give the answer as a single integer."
        )

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if _parse_int(answer) == reference else 0.0


def _draw(side: int, walls: list, start: tuple, target: tuple) -> list:
    """The grid as a list of row strings."""
    rows = [["." for _ in range(side)] for _ in range(side)]
    for r, c in walls:
        rows[r][c] = "#"
    rows[start[0]][start[1]] = "S"
    rows[target[0]][target[1]] = "T"
    return ["".join(row) for row in rows]


def _distance(grid: list) -> int:
    """Breadth-first search from S; the number of steps to T, or -1 if T is unreachable."""
    height, width = len(grid), len(grid[0])
    start = next((r, c) for r in range(height) for c in range(width) if grid[r][c] == "S")
    steps = {start: 0}
    queue = collections.deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == "T":
            return steps[(r, c)]
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            inside = 0 <= nr < height and 0 <= nc < width
            if inside and grid[nr][nc] != "#" and (nr, nc) not in steps:
                steps[(nr, nc)] = steps[(r, c)] + 1
                queue.append((nr, nc))
    return -1


def _parse_int(text: str) -> int | None:
    """The integer that the whole text spells (an optional trailing period allowed), else None."""
    match = INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None
