"""The contract test: every seed passes each rule of L2 to L5, over 50 seeds at the min, middle
and max difficulty, through the same checks the validator runs (in the sandbox)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evoenv_worker import running_checks
from evoenv_worker.mechanical import SourceRunner, _fresh_factory
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.static import check_static

SEEDS = sorted((Path(__file__).resolve().parents[1] / "seeds").glob("*.py"))
N_SEEDS = 50


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def sandbox(settings: Settings) -> Iterator[Sandbox]:
    with Sandbox(settings.sandbox) as box:
        yield box


def test_there_are_ten_seeds_of_both_kinds() -> None:
    assert len(SEEDS) == 10
    texts = [path.read_text() for path in SEEDS]
    assert sum('oracle = "feasibility"' in text for text in texts) >= 3
    assert sum('oracle = "equality"' in text for text in texts) >= 6


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_seed_passes_l1_to_l5(path: Path, sandbox: Sandbox, settings: Settings) -> None:
    data = path.read_bytes()
    static = check_static(data, settings.validation.max_source_bytes)
    assert static.ok, static.detail
    assert static.name == path.stem, "a seed's file is named after its environment"

    runner = SourceRunner(sandbox, data.decode(), path.name)
    check, meta = running_checks.describe(runner)
    assert check.ok and meta is not None, check.detail
    assert (meta.min_difficulty, meta.max_difficulty) == (1, 10)

    check, items = running_checks.check_executes(runner, meta, range(N_SEEDS), settings.validation)
    assert check.ok, (check.detail, check.trigger)
    assert len(items) == 3 * N_SEEDS
    slowest = check.data["slowest_seconds"]
    assert slowest < 1.0, f"a routine took {slowest:.2f} s"

    fresh = _fresh_factory(sandbox, data.decode(), path.name)
    check = running_checks.check_deterministic(fresh, items, hash_seeds=(7, 12345))
    assert check.ok, (check.detail, check.trigger)

    for start in range(0, N_SEEDS, settings.validation.seeds):  # L4's variety, per block of 8
        block = [item for item in items if start <= item.seed < start + settings.validation.seeds]
        if len({item.seed for item in block}) == settings.validation.seeds:
            check = running_checks.check_nontrivial(block, meta, settings.validation)
            assert check.ok, (check.detail, check.trigger)
    check = running_checks.check_nontrivial(items, meta, settings.validation)
    assert check.ok, (check.detail, check.trigger)
    check = running_checks.check_well_posed(runner, items, meta, settings.validation)
    assert check.ok, (check.detail, check.trigger)

    check = running_checks.check_scorer(runner, items, meta, settings.validation)
    assert check.ok, (check.detail, check.trigger)
    assert check.data["probes"] >= 7 * len(items)
