"""The orchestrator's serving-difficulty search, driven with a fake measuring layer (a synthetic
pass-rate curve per environment) over a pool on a SQLite archive: no services."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evoenv_learner.difficulty import nearest
from evoenv_learner.levels import LEVEL_WINDOW
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.pool import Pool, PoolEntry
from shared.config import Settings
from shared.db import Archive, EnvironmentRow
from shared.env_stats import CalibrationFigures, EnvStats
from shared.environment import TRAIN_SEEDS
from shared.messages import SolverJob

SEEDS = Path(__file__).resolve().parents[2] / "seeds"
TARGET = 0.3


def logistic(midpoint: float, slope: float = 1.5) -> Callable[[int], float]:
    """A pass rate falling from ~1 to ~0 around `midpoint` (levels 1-10)."""
    return lambda level: 1.0 / (1.0 + math.exp(slope * (level - midpoint)))


EASY_ENOUGH = logistic(7.4)
"""Nearest the target at level 8 (0.29); the search from 5 measures 5, 8, 6, 7."""
HARD = logistic(2.2)
"""Nearest the target at level 3 (0.23); the search from 5 measures 5, 2, 3."""


class FakeSolver:
    """The measuring layer: each environment's pass rate at a level read off its curve (None
    where it has none: nothing measurable); every call recorded. With `stop_after`, the learner
    stops during that call, which then measures nothing, as the real layer does."""

    def __init__(
        self, curves: dict[str, Callable[[int], float]], stop_after: int | None = None
    ) -> None:
        self.curves = curves
        self.stop_after = stop_after
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, entry: PoolEntry, level: int, stop: asyncio.Event) -> float | None:
        self.calls.append((entry.name, level))
        await asyncio.sleep(0)
        if len(self.calls) == self.stop_after:
            stop.set()
            return None
        curve = self.curves.get(entry.name)
        return None if curve is None else curve(level)

    def levels(self, name: str) -> list[int]:
        return [level for env, level in self.calls if env == name]


async def no_backlog() -> int:
    return 0


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    """A seed and two admitted environments (calibrated at 5), in order of admission."""
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    archive.add_environment(
        "edit_distance", (SEEDS / "edit_distance.py").read_text(), status="seed", origin="seed"
    )
    for name, seed_file in (("easy_enough", "sort_words.py"), ("hard", "knapsack_max_value.py")):
        sha = archive.add_environment(
            name, (SEEDS / seed_file).read_text(), status="admitted", origin="generated"
        )
        with archive.session() as session:
            row = session.get(EnvironmentRow, sha)
            assert row is not None
            row.stats = EnvStats(
                calibration_difficulty=5, calibration=CalibrationFigures(pass_rate=0.25)
            )
            session.add(row)
            session.commit()
    return archive


def learner(archive: Archive, **settings: Any) -> Orchestrator:
    """An orchestrator on a fresh view of the archive, as a (re)started learner has."""
    s = Settings(**settings)
    return Orchestrator(s, Pool(archive, s.pool), backlog=no_backlog)


def member(orchestrator: Orchestrator, name: str) -> PoolEntry:
    return next(m for m in orchestrator.pool.members if m.name == name)


def stats(archive: Archive, orchestrator: Orchestrator, name: str) -> dict[str, Any]:
    row = archive.environment(member(orchestrator, name).sha)
    assert row is not None
    return row.stats.to_json()


async def drive(orchestrator: Orchestrator, measure: FakeSolver, *wanted: str) -> None:
    """Run `search_serving` until the `wanted` environments are searched (or it stops), and a
    little longer: time enough for any further search to start."""
    stop = asyncio.Event()
    task = asyncio.create_task(orchestrator.search_serving(stop, measure))
    while not task.done() and not all(member(orchestrator, n).searched for n in wanted):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, timeout=10)


def test_each_admitted_environment_is_served_at_the_level_nearest_the_target(
    archive: Archive,
) -> None:
    orchestrator = learner(archive)
    easy, seed = member(orchestrator, "easy_enough"), member(orchestrator, "edit_distance")
    assert orchestrator.awaits_search(easy) and not orchestrator.awaits_search(seed)
    assert orchestrator.difficulty(easy) == 5  # the calibration difficulty until the search
    for _ in range(LEVEL_WINDOW):
        orchestrator.record_outcome(easy.sha, 5, 8, 8)
    assert orchestrator.difficulty(easy) == 5  # ...held: the search decides the level
    assert orchestrator.difficulty(seed) == 1  # seeds start at their easiest level

    solver = FakeSolver({"easy_enough": EASY_ENOUGH, "hard": HARD})
    asyncio.run(drive(orchestrator, solver, "easy_enough", "hard"))

    # One search at a time, oldest admission first, each a bisection from the calibration
    # difficulty within the rounds; the seed is never measured.
    assert [env for env, _ in solver.calls] == ["easy_enough"] * 4 + ["hard"] * 3
    assert solver.levels("easy_enough") == [5, 8, 6, 7]
    assert solver.levels("hard") == [5, 2, 3]
    for name, curve, level in (("easy_enough", EASY_ENOUGH, 8), ("hard", HARD, 3)):
        assert level == nearest({lv: curve(lv) for lv in range(1, 11)}, TARGET)
        recorded = stats(archive, orchestrator, name)
        assert recorded["serving_difficulty"] == level
        assert recorded["serving_curve"] == {
            str(lv): curve(lv) for lv in sorted(solver.levels(name))
        }
        assert [h["level"] for h in recorded["pass_rate_history"]] == [level]
        assert recorded["calibration_difficulty"] == 5  # admission's figures are kept
        entry = member(orchestrator, name)
        assert entry.searched and entry.difficulty == level
        assert orchestrator.difficulty(entry) == level

    # Served there, it moves with the solver as any tracked level does.
    easy = member(orchestrator, "easy_enough")
    for _ in range(LEVEL_WINDOW):
        orchestrator.record_outcome(easy.sha, 8, 8, 8)
    assert orchestrator.difficulty(easy) == 9

    # A restarted learner searches nothing again and serves at the recorded level.
    again = learner(archive)
    idle = FakeSolver({})
    asyncio.run(drive(again, idle))
    assert idle.calls == []
    assert again.difficulty(member(again, "hard")) == 3


def test_a_search_cut_short_records_nothing_and_runs_again_after_a_restart(
    archive: Archive,
) -> None:
    orchestrator = learner(archive, learner={"environments": ["easy_enough"]})
    orchestrator.levels[member(orchestrator, "easy_enough").sha] = 2  # from an old checkpoint
    assert orchestrator.difficulty(member(orchestrator, "easy_enough")) == 5  # not overriding
    stopped = FakeSolver({"easy_enough": EASY_ENOUGH}, stop_after=2)
    asyncio.run(drive(orchestrator, stopped, "easy_enough"))
    assert stopped.levels("easy_enough") == [5, 8]
    assert "serving_difficulty" not in stats(archive, orchestrator, "easy_enough")
    assert orchestrator.awaits_search(member(orchestrator, "easy_enough"))

    restarted = learner(archive, learner={"environments": ["easy_enough"]})
    solver = FakeSolver({"easy_enough": EASY_ENOUGH})
    asyncio.run(drive(restarted, solver, "easy_enough"))
    assert solver.levels("easy_enough") == [5, 8, 6, 7]  # from scratch, "hard" not wanted
    assert stats(archive, restarted, "easy_enough")["serving_difficulty"] == 8


def test_a_search_that_measures_nothing_is_given_up_until_a_restart(archive: Archive) -> None:
    orchestrator = learner(archive, learner={"environments": ["hard"]})
    solver = FakeSolver({})  # every round measures nothing (all env_error, say)
    asyncio.run(drive(orchestrator, solver))
    assert solver.calls == [("hard", 5)]  # one round, then no retry in this process
    hard = member(orchestrator, "hard")
    assert not orchestrator.awaits_search(hard)
    assert "serving_difficulty" not in stats(archive, orchestrator, "hard")
    assert orchestrator.difficulty(hard) == 5  # served at calibration, moving with the solver
    for _ in range(LEVEL_WINDOW):
        orchestrator.record_outcome(hard.sha, 5, 0, 8)
    assert orchestrator.difficulty(hard) == 4
    assert learner(archive).awaits_search(member(learner(archive), "hard"))


def test_no_search_at_a_fixed_difficulty_or_with_zero_rounds(archive: Archive) -> None:
    for settings in ({"learner": {"difficulty": 3}}, {"admission": {"serving_rounds": 0}}):
        orchestrator = learner(archive, **settings)
        solver = FakeSolver({"easy_enough": EASY_ENOUGH, "hard": HARD})
        asyncio.run(drive(orchestrator, solver))
        assert solver.calls == []
        assert not orchestrator.awaits_search(member(orchestrator, "hard"))
    assert orchestrator.difficulty(member(orchestrator, "hard")) == 5  # calibration, tracked


class FakeResult:
    """A chain's AsyncResult: ends after `polls` looks, with `value` (None: the chain failed)."""

    def __init__(self, value: dict[str, Any] | None, polls: int = 1) -> None:
        self.value = value
        self.polls = polls

    def ready(self) -> bool:
        self.polls -= 1
        return self.polls <= 0

    def successful(self) -> bool:
        return self.value is not None

    @property
    def result(self) -> dict[str, Any] | None:
        return self.value


def test_a_round_counts_passes_as_calibration_does(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code around the Celery chains: m jobs of one fresh training instance each, on the
    `-serving` run; passes out of the instances counted (`ServingSearch.measure_pass_rate`)."""
    orchestrator = learner(archive, run="r")
    outcomes: list[dict[str, Any] | None] = [
        {"rewards": [1.0]},
        {"rewards": [1.0]},
        {"rewards": [0.0]},
        {"rewards": [0.5]},  # partial credit is not a pass
        {"rewards": []},  # no completion (prompt over budget): a fail
        {"rewards": [None]},  # env_error: left out
        None,  # the chain failed: left out
        {"rewards": [1.0]},
    ]
    sent: list[SolverJob] = []

    def send_chain(job: SolverJob) -> FakeResult:
        sent.append(job)
        return FakeResult(outcomes[len(sent) - 1], polls=len(sent) % 3)

    monkeypatch.setattr(orchestrator.solvers, "send_chain", send_chain)
    hard = member(orchestrator, "hard")
    rate = asyncio.run(orchestrator.measure_pass_rate(hard, 7, asyncio.Event()))
    assert rate == 3 / 6
    assert len(sent) == orchestrator.settings.admission.calibration_instances
    for job in sent:
        assert (job.run, job.env.sha, job.difficulty, job.group_size) == (
            "r-serving",
            hard.sha,
            7,
            1,
        )
        assert job.temperature == orchestrator.settings.grpo.temperature
        assert job.seed in TRAIN_SEEDS

    outcomes[:] = [{"rewards": [None]}] * 8
    sent.clear()
    assert asyncio.run(orchestrator.measure_pass_rate(hard, 7, asyncio.Event())) is None
    stopped = asyncio.Event()
    stopped.set()
    sent.clear()
    assert asyncio.run(orchestrator.measure_pass_rate(hard, 7, stopped)) is None
