"""The orchestrator's difficulty tracking and synchronous mode's gating (pure: no services)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from evoenv_learner import orchestrator as orchestrator_module
from evoenv_learner.levels import LEVEL_WINDOW, SPREAD_FLOOR, SPREAD_WINDOW
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.pool import PoolEntry, draw
from shared.config import Settings
from shared.messages import SolverJob

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


def test_the_draw_favours_environments_whose_groups_had_reward_spread() -> None:
    orchestrator, entry = make()
    untried = orchestrator.draw_weight(entry)
    assert untried == pytest.approx(0.55)
    for _ in range(SPREAD_WINDOW):
        orchestrator.record_outcome("s", 1, 0, 4, spread=False)  # all wrong: nothing to learn
    alike = orchestrator.draw_weight(entry)
    assert alike == pytest.approx(SPREAD_FLOOR + (1 - SPREAD_FLOOR) / (SPREAD_WINDOW + 2))
    orchestrator.record_outcome("s", 1, 2, 4, spread=True)  # only the last 8 count
    assert orchestrator.draw_weight(entry) == pytest.approx(
        SPREAD_FLOOR + (1 - SPREAD_FLOOR) * 2 / (SPREAD_WINDOW + 2)
    )
    orchestrator.levels["s"] = 2  # a new level starts its own count
    assert orchestrator.draw_weight(entry) == pytest.approx(untried)


class _Pool:
    """Two members, no seeds: the pool's draw is then the weighted one over both."""

    def __init__(self, *entries: PoolEntry) -> None:
        self.members = list(entries)

    def choose(self, rng: Any, weight: Any = None) -> PoolEntry:
        return draw(self.members, rng, weight)


@pytest.mark.parametrize("mode", ["spread", "uniform"])
def test_spread_draws_mostly_what_can_be_learned_and_uniform_does_not(mode: str) -> None:
    source = SEED.read_text()
    learnable = PoolEntry(sha="a", name="a", source=source, origin="admitted", difficulty=None)
    alike = PoolEntry(sha="b", name="b", source=source, origin="admitted", difficulty=None)
    orchestrator = Orchestrator(
        Settings(learner={"solver_draw": mode}),
        pool=_Pool(learnable, alike),  # type: ignore[arg-type]
        backlog=no_backlog,
        rng=random.Random(3),
    )
    for sha, spread in (("a", True), ("b", False)):
        for _ in range(SPREAD_WINDOW):
            orchestrator.record_outcome(sha, 1, 1, 4, spread=spread)
    draws = 4000
    share = sum(orchestrator.solvers.choose() is learnable for _ in range(draws)) / draws
    # weights 0.1 + 0.9 x 9/10 = 0.91 and 0.1 + 0.9 x 1/10 = 0.19: a share of 0.83 (sd 0.006)
    expected = 0.91 / (0.91 + 0.19) if mode == "spread" else 0.5
    assert abs(share - expected) < 0.03


def test_an_over_budget_prompt_lowers_the_ceiling() -> None:
    orchestrator, entry = make()
    orchestrator.levels["s"] = 6
    orchestrator.over_budget("s", 6)
    assert orchestrator.difficulty(entry) == 5


class Pending:
    """A chain's AsyncResult that never finishes (the group is settled by the learner)."""

    def ready(self) -> bool:
        return False


class OnePool:
    def __init__(self, entry: PoolEntry) -> None:
        self.members = [entry]

    def record_use(self, sha: str) -> None:
        pass


def sending(learner: dict[str, Any]) -> tuple[Orchestrator, list[str]]:
    """An orchestrator on `sort_words` with batches of 2 whose chains are recorded, not sent."""
    _, entry = make()
    settings = Settings(
        learner={"environments": ["sort_words"], "generator_groups_in_flight": 0, **learner},
        grpo={"batch_groups": 2},
    )
    orchestrator = Orchestrator(settings, pool=OnePool(entry), backlog=no_backlog)  # type: ignore[arg-type]
    sent: list[str] = []

    def send_chain(job: SolverJob) -> Pending:
        sent.append(job.group_id)
        return Pending()

    orchestrator.solvers.send_chain = send_chain  # type: ignore[method-assign]
    return orchestrator, sent


async def sent_now(orchestrator: Orchestrator, sent: list[str], poke: bool = True) -> int:
    """How many groups were sent once the orchestrator has looked again (`poke`: a poll now;
    without, only what wakes it by itself: its own poll is an hour away)."""
    if poke:
        orchestrator._wake.set()
    for _ in range(5):
        await asyncio.sleep(0.01)
    return len(sent)


def test_synchronous_mode_sends_one_batch_per_pushed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrator_module, "SEND_POLL_SECONDS", 3600.0)
    asyncio.run(synchronous_round())


def test_asynchronous_mode_keeps_its_groups_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrator_module, "SEND_POLL_SECONDS", 3600.0)
    asyncio.run(asynchronous_flight())


async def synchronous_round() -> None:
    orchestrator, sent = sending({"synchronous": True, "solver_groups_in_flight": 8})
    stop = asyncio.Event()
    task = asyncio.create_task(orchestrator.run(stop))
    try:
        assert await sent_now(orchestrator, sent, poke=False) == 2  # one batch, not 8
        assert await sent_now(orchestrator, sent) == 2  # later polls send nothing more
        orchestrator.solver_settled(sent[0], trained=False)  # no reward variance
        assert await sent_now(orchestrator, sent, poke=False) == 3  # replaced at once
        orchestrator.solver_settled(sent[1], trained=True)
        orchestrator.solver_settled(sent[2], trained=True)
        orchestrator.solver_settled("an old group", trained=True)  # not of this round
        assert await sent_now(orchestrator, sent) == 3  # full: nothing until trained and pushed
        orchestrator.batch_trained()
        assert await sent_now(orchestrator, sent, poke=False) == 5  # the next round, at once
        assert await sent_now(orchestrator, sent) == 5
    finally:
        stop.set()
        await task


async def asynchronous_flight() -> None:
    orchestrator, sent = sending({"solver_groups_in_flight": 3})
    stop = asyncio.Event()
    task = asyncio.create_task(orchestrator.run(stop))
    try:
        assert await sent_now(orchestrator, sent, poke=False) == 3
        orchestrator.solver_settled(sent[0], trained=True)  # still in flight: no rounds here
        orchestrator.batch_trained()
        assert await sent_now(orchestrator, sent) == 3
    finally:
        stop.set()
        await task
