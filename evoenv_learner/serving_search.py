"""The serving-difficulty search: for each admitted environment in turn, the level whose solver
pass rate is nearest the target, measured through the usual chain on a stream training never
reads (`RUN-serving`), recorded in the pool and served from then on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from evoenv_learner.difficulty import DifficultySearch, SearchResult
from evoenv_learner.dispatch import SolverDispatch, chain_results
from evoenv_learner.levels import LevelTracker
from evoenv_learner.pool import Pool, PoolEntry
from shared.config import Settings

log = structlog.get_logger(__name__)

SEARCH_POLL_SECONDS = 5.0
"""How often `search_serving` looks again for an environment awaiting its search."""

Measure = Callable[[PoolEntry, int, asyncio.Event], Awaitable[float | None]]
"""The solver's pass rate on an environment at a level; None when the learner is stopping or
nothing could be measured (`ServingSearch.measure_pass_rate`; tests pass a fake)."""


@dataclass
class ServingSearch:
    """Serving difficulty (beyond the reference design): `search_serving` finds, for each
    admitted environment in turn, the level whose solver pass rate is nearest the target
    (`difficulty.py`) and records it in the pool with the measured curve; solver groups are then
    served at that level, which `LevelTracker.record_outcome` moves as the solver improves.
    Until its search ends an environment is served at its calibration difficulty, which does
    not move. One search runs at a time (m instances in flight at most), each round's instances
    graded on a stream of their own (`RUN-serving`) that training never reads. The result lives
    in the archive, so a learner restart searches again only the environments whose search had
    not finished. Seeds are not searched (`LevelTracker.awaits_search`). The admission gate and
    the generator's reward keep the fixed calibration difficulty: nothing here touches them."""

    settings: Settings
    pool: Pool
    tracker: LevelTracker
    solvers: SolverDispatch
    """Builds and sends the measuring instances (`solver_job`, `send_chain`)."""

    async def search_serving(self, stop: asyncio.Event, measure: Measure | None = None) -> None:
        """Search the serving difficulty of each environment that awaits it, oldest first and
        one at a time, until `stop`. New admissions join `pool.members` on the pool's refresh
        (which every solver draw checks)."""
        wanted = set(self.settings.learner.environments)
        while not stop.is_set():
            entry = next(
                (
                    m
                    for m in self.pool.members
                    if (not wanted or m.name in wanted) and self.tracker.awaits_search(m)
                ),
                None,
            )
            if entry is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=SEARCH_POLL_SECONDS)
                continue
            await self.search_one(entry, stop, measure or self.measure_pass_rate)

    async def search_one(
        self, entry: PoolEntry, stop: asyncio.Event, measure: Measure
    ) -> SearchResult | None:
        """One search: bisection from the calibration difficulty (the middle of the range if
        none was recorded), `admission.serving_rounds` measurements at most; the level found
        and the curve go to the pool, and the level is served from now on.

        A round that measures nothing ends the search with the rounds before it; if there were
        none, the environment is given up for this process (served at its calibration
        difficulty, moving with the solver). Returns None then, and when stopped first: the
        pool records nothing, so the next learner searches it again."""
        info = self.tracker.info(entry)
        start = (info.low + info.high) // 2 if entry.difficulty is None else entry.difficulty
        search = DifficultySearch(
            info.low,
            info.high,
            max(info.low, min(info.high, start)),
            target=self.settings.admission.target_pass_rate,
            rounds=self.settings.admission.serving_rounds,
        )
        while (level := search.next_level()) is not None and not stop.is_set():
            rate = await measure(entry, level, stop)
            if rate is None:
                break
            search.report(level, rate)
            log.info(
                "serving_search_round",
                env=entry.name,
                env_sha=entry.sha,
                round=len(search.curve),
                level=level,
                pass_rate=round(rate, 3),
            )
        if stop.is_set() and search.next_level() is not None:
            return None
        if not search.curve:
            self.tracker.give_up_search(entry.sha)
            log.warning(
                "serving_search_given_up", env=entry.name, env_sha=entry.sha, level=search.start
            )
            return None
        result = search.result()
        await asyncio.to_thread(
            self.pool.set_serving_difficulty, entry.sha, result.level, result.curve
        )
        self.tracker.searched(entry.sha, result.level)
        return result

    async def measure_pass_rate(
        self, entry: PoolEntry, level: int, stop: asyncio.Event
    ) -> float | None:
        """The solver's pass rate at `level`, measured as calibration measures it: m fresh
        instances from the training seed range, one completion each at the training
        temperature, a pass being a score of exactly 1.0. (m instances once each rather than m
        completions of one instance: the rate is then over instances, as the calibration rate
        it starts from.) Each instance is a group of one sent down the usual chain, its run
        `RUN-serving`, a stream that training never reads.

        An instance left without a completion (its prompt over the budget, or its sampling
        failed) counts as a fail: a level that cannot be served is no level to serve at. An
        env_error grading and a chain that failed are left out. None when stopped first or
        when nothing was counted."""
        jobs = [
            self.solvers.solver_job(
                entry, run=f"{self.settings.run}-serving", difficulty=level, group_size=1
            )
            for _ in range(self.settings.admission.calibration_instances)
        ]
        graded = await chain_results([self.solvers.send_chain(job) for job in jobs], stop)
        if stop.is_set():
            return None
        passes: list[float] = []
        for result in graded:
            if result is not None:
                rewards = result.get("rewards") or [0.0]
                passes += [float(reward == 1.0) for reward in rewards if reward is not None]
        return sum(passes) / len(passes) if passes else None
