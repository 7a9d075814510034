"""Feasibility seeds accept every valid answer, not only the planted one.

For small instances a brute-force search (independent of the seed's scorer) finds a valid answer
that differs from the planted reference; the scorer must give it 1.0, and must give 0.0 to the
first invalid candidate the search meets.
"""

import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared.environment import Environment, make_rng  # noqa: E402

SEEDS = range(30)
DIFFICULTIES = range(1, 5)
MIN_ALTERNATIVES = 5


def load_seed(name: str) -> Environment:
    spec = importlib.util.spec_from_file_location(f"seeds.{name}", ROOT / "seeds" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [
        value
        for value in module.__dict__.values()
        if isinstance(value, type) and issubclass(value, Environment) and value is not Environment
    ]
    assert len(classes) == 1
    return classes[0]()


def subset_sum_candidates(instance: dict[str, Any]) -> Iterator[tuple[list[int], bool]]:
    numbers = instance["numbers"]
    for count in range(1, len(numbers) + 1):
        for chosen in itertools.combinations(range(len(numbers)), count):
            yield list(chosen), sum(numbers[i] for i in chosen) == instance["target"]


def coloring_candidates(instance: dict[str, Any]) -> Iterator[tuple[list[int], bool]]:
    colors = range(1, instance["colors"] + 1)
    for coloring in itertools.product(colors, repeat=instance["size"]):
        yield list(coloring), all(coloring[u] != coloring[v] for u, v in instance["edges"])


def sat_candidates(instance: dict[str, Any]) -> Iterator[tuple[list[int], bool]]:
    for values in itertools.product((0, 1), repeat=instance["size"]):
        valid = all(
            any((values[abs(lit) - 1] == 1) == (lit > 0) for lit in clause)
            for clause in instance["clauses"]
        )
        yield list(values), valid


CANDIDATES: dict[str, Callable[[dict[str, Any]], Iterator[tuple[list[int], bool]]]] = {
    "planted_subset_sum": subset_sum_candidates,
    "graph_coloring": coloring_candidates,
    "planted_sat": sat_candidates,
}


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_alternative_valid_answers_score_one(name: str) -> None:
    env = load_seed(name)
    assert env.oracle == "feasibility"
    alternatives = 0
    for difficulty in DIFFICULTIES:
        for seed in SEEDS:
            instance = env.sample(make_rng(name, seed, difficulty), difficulty)
            reference = env.solve(instance)
            alternative, invalid = None, None
            for candidate, valid in CANDIDATES[name](instance):
                if valid and alternative is None and candidate != list(reference):
                    alternative = candidate
                if not valid and invalid is None:
                    invalid = candidate
                if alternative is not None and invalid is not None:
                    break
            if alternative is not None:
                alternatives += 1
                text = ", ".join(str(x) for x in alternative)
                assert env.score(instance, reference, text) == 1.0, (seed, difficulty, text)
            if invalid is not None:
                text = ", ".join(str(x) for x in invalid)
                assert env.score(instance, reference, text) == 0.0, (seed, difficulty, text)
    assert alternatives >= MIN_ALTERNATIVES, f"only {alternatives} alternatives found"
