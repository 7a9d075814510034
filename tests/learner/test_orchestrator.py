"""The orchestrator's difficulty tracking (pure: no services)."""

from __future__ import annotations

from pathlib import Path

from evoenv_learner.orchestrator import LEVEL_WINDOW, Orchestrator
from evoenv_learner.pool import PoolEntry
from shared.config import Settings

SEED = Path(__file__).resolve().parents[2] / "seeds" / "sort_words.py"


async def no_backlog() -> int:
    return 0


def make() -> tuple[Orchestrator, PoolEntry]:
    orchestrator = Orchestrator(Settings(), pool=None, backlog=no_backlog)  # type: ignore[arg-type]
    entry = PoolEntry(
        sha="s", name="sort_words", source=SEED.read_text(), origin="seed", difficulty=None
    )
    return orchestrator, entry


def test_an_environment_starts_at_its_easiest_level_and_climbs_when_solved() -> None:
    orchestrator, entry = make()
    assert orchestrator.difficulty(entry) == 1
    for _ in range(LEVEL_WINDOW):
        orchestrator.record_outcome("s", 1, 7, 8)  # 0.875 > 0.3 + band
    assert orchestrator.difficulty(entry) == 2
    for _ in range(LEVEL_WINDOW - 1):
        orchestrator.record_outcome("s", 2, 0, 8)
    assert orchestrator.difficulty(entry) == 2  # not before a full window
    orchestrator.record_outcome("s", 2, 0, 8)
    assert orchestrator.difficulty(entry) == 1
    for _ in range(2 * LEVEL_WINDOW):
        orchestrator.record_outcome("s", 1, 0, 8)
    assert orchestrator.difficulty(entry) == 1  # never below the easiest level


def test_outcomes_at_another_level_and_a_fixed_difficulty_move_nothing() -> None:
    orchestrator, entry = make()
    orchestrator.difficulty(entry)
    for _ in range(LEVEL_WINDOW):
        orchestrator.record_outcome("s", 5, 8, 8)  # stale groups from another level
    assert orchestrator.difficulty(entry) == 1
    fixed = Orchestrator(Settings(learner={"difficulty": 3}), pool=None, backlog=no_backlog)  # type: ignore[arg-type]
    for _ in range(LEVEL_WINDOW):
        fixed.record_outcome("s", 3, 8, 8)
    assert fixed.difficulty(entry) == 3


def test_an_over_budget_prompt_lowers_the_ceiling() -> None:
    orchestrator, entry = make()
    orchestrator.levels["s"] = 6
    orchestrator.over_budget("s", 6)
    assert orchestrator.difficulty(entry) == 5
