"""The orchestrator: keeps a bounded number of solver and generator groups in flight, composed of
the solver dispatch (`dispatch.py`), the served levels and spread (`levels.py`), the
serving-difficulty search (`serving_search.py`) and the proposals (`proposals.py`)."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from evoenv_learner.dispatch import SolverDispatch
from evoenv_learner.levels import LevelTracker
from evoenv_learner.outage import LOST, Outage
from evoenv_learner.pool import Pool, PoolEntry
from evoenv_learner.proposals import Proposals
from evoenv_learner.serving_search import Measure, ServingSearch
from shared.config import Settings

log = structlog.get_logger(__name__)

SEND_POLL_SECONDS = 0.5
"""How often `run` reaps finished chains and sends new groups (sooner when woken)."""


@dataclass
class Orchestrator:
    """Sends solver groups (`solvers`) and generation groups (`proposals`) while the stream
    holds no more unread groups than `learner.stream_backlog` (the backpressure), and searches
    the serving difficulty of new admissions (`search`); `tracker` holds the levels served.
    Its methods here are what the learner calls: the group intake settles each group read
    (`generation_done`, `solver_settled`, `record_outcome`, `over_budget`), the trainer reports
    its steps (`batch_trained`, `dropped_at_step`), checkpoints keep `levels` and `spread`.

    In synchronous mode no generation groups are sent. The orchestrator never imports
    environment code: it reads the class attributes it needs (name, oracle, difficulty range)
    from the source's syntax tree (`LevelTracker.info`)."""

    settings: Settings
    pool: Pool
    backlog: Callable[[], Any]
    """Coroutine function: how many graded groups wait unread in the stream."""
    rng: random.Random = field(default_factory=random.Random)
    expire_group: Callable[[str, str], bool] | None = None
    """Finalise a generation group as expired, given why (`generation.expire_group`, handed in
    by the command: `loop.GroupExpiry`); False when it completed first. None: only its slot is
    freed (tests, and `python -m evoenv_learner`)."""
    funnel: dict[str, int] = field(default_factory=dict)
    """Admission outcomes counted per candidate (the learner's funnel, shared with it)."""
    clock: Callable[[], float] = time.monotonic
    """Seconds for the groups' deadlines; the learner's stands still while the servers are
    paused (`shared.pauses.ServingClock`), so a push or a step taken in turns never makes a
    group overdue."""
    tracker: LevelTracker = field(init=False)
    solvers: SolverDispatch = field(init=False)
    search: ServingSearch = field(init=False)
    proposals: Proposals = field(init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    """Set to send at once rather than at the next poll (synchronous mode's rounds)."""

    def __post_init__(self) -> None:
        s, pool, rng, clock = self.settings, self.pool, self.rng, self.clock
        self.tracker = LevelTracker(s)
        self.solvers = SolverDispatch(s, pool, self.tracker, rng, clock, self._wake)
        self.search = ServingSearch(s, pool, self.tracker, self.solvers)
        self.proposals = Proposals(
            s, pool, self.tracker, rng, clock, self.expire_group, self.funnel
        )

    async def run(self, stop: asyncio.Event) -> None:
        synchronous = self.settings.learner.synchronous
        if synchronous and self.settings.learner.generator_groups_in_flight:
            log.warning("synchronous_mode", detail="no generation groups are sent")
        outage = Outage("jobs")
        while not stop.is_set():
            try:
                await self._round(synchronous)
            except LOST as exc:  # Redis lost: waited for, up to `outage.REDIS_OUTAGE`
                await outage.failed(exc)
                continue
            outage.ok()
            await self._pause(stop, SEND_POLL_SECONDS)

    async def _round(self, synchronous: bool) -> None:
        """Reap what came back, expire what is lost, and send what the slots allow."""
        self.solvers.reap()
        await self.proposals.expire_lost()
        if await self.backlog() < self.settings.learner.stream_backlog:
            for _ in range(self.solvers.wanted()):
                self.solvers.send()
            while not synchronous and (
                len(self.proposals.in_flight) < self.settings.learner.generator_groups_in_flight
            ):
                self.proposals.send()

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        """Until `stop`, `batch_trained` or `seconds` have passed, whichever comes first."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self._wake.clear()

    def forget(self) -> None:
        """Let go of the jobs' results still held, while their Redis is up: a Celery result
        collected later, after Redis stopped, retries its unsubscribe for seconds and prints a
        traceback (`evoenv up` stops its Redis after the learner)."""
        self.solvers.in_flight.clear()
        self.proposals.in_flight.clear()
        gc.collect()

    def groups_in_flight(self) -> int:
        """Solver and generator groups sent and not yet back: a solver group until its chain
        ends (its group then waits in the stream), a generation group until it is read."""
        return len(self.solvers.in_flight) + len(self.proposals.in_flight)

    @property
    def solver_in_flight(self) -> dict[str, Any]:
        """Solver groups whose chains have not ended (`SolverDispatch.in_flight`)."""
        return self.solvers.in_flight

    @property
    def generator_in_flight(self) -> dict[str, Any]:
        """Generation groups sent and not yet read (`Proposals.in_flight`)."""
        return self.proposals.in_flight

    # ------------------------------------------------------------------- solver dispatch

    def solver_settled(self, group_id: str, trained: bool) -> None:
        """A solver group reached the learner (`SolverDispatch.settled`)."""
        self.solvers.settled(group_id, trained)

    def dropped_at_step(self, groups: int) -> None:
        """Groups counted as trained were dropped at the step (`SolverDispatch`)."""
        self.solvers.dropped_at_step(groups)

    def batch_trained(self) -> None:
        """The trainer took a batch, stepped and pushed (`SolverDispatch`)."""
        self.solvers.batch_trained()

    @property
    def round_pending(self) -> set[str]:
        """Synchronous mode: this round's solver groups sent and not yet settled."""
        return self.solvers.round_pending

    @property
    def round_trained(self) -> int:
        """Synchronous mode: this round's groups that went to the trainer."""
        return self.solvers.round_trained

    # -------------------------------------------------------------------- levels, spread

    @property
    def levels(self) -> dict[str, int]:
        """Per environment: the difficulty solver groups are served at now (checkpointed)."""
        return self.tracker.levels

    @property
    def spread(self) -> dict[str, list[int]]:
        """Per "SHA/LEVEL": the reward spread of its last solver groups (checkpointed)."""
        return self.tracker.spread

    def difficulty(self, entry: PoolEntry) -> int:
        """The level `entry`'s solver groups are served at now (`LevelTracker.difficulty`)."""
        return self.tracker.difficulty(entry)

    def draw_weight(self, entry: PoolEntry) -> float:
        """How strongly the solver draw favours `entry` (`LevelTracker.draw_weight`)."""
        return self.tracker.draw_weight(entry)

    def record_outcome(
        self, env_sha: str, difficulty: int, passes: int, total: int, *, spread: bool | None = None
    ) -> None:
        """A solver group's passes at its level (`LevelTracker.record_outcome`)."""
        self.tracker.record_outcome(env_sha, difficulty, passes, total, spread=spread)

    def over_budget(self, env_sha: str, difficulty: int) -> None:
        """A prompt at `difficulty` did not fit (`LevelTracker.over_budget`)."""
        self.tracker.over_budget(env_sha, difficulty)

    # ---------------------------------------------------------------- serving difficulty

    def awaits_search(self, entry: PoolEntry) -> bool:
        """Whether `entry` is still to be searched (`LevelTracker.awaits_search`)."""
        return self.tracker.awaits_search(entry)

    async def search_serving(self, stop: asyncio.Event, measure: Measure | None = None) -> None:
        """Search the serving difficulty of each environment awaiting it, until `stop`
        (`ServingSearch.search_serving`)."""
        await self.search.search_serving(stop, measure)

    async def measure_pass_rate(
        self, entry: PoolEntry, level: int, stop: asyncio.Event
    ) -> float | None:
        """The solver's pass rate at `level` (`ServingSearch.measure_pass_rate`)."""
        return await self.search.measure_pass_rate(entry, level, stop)

    # ------------------------------------------------------------------------- proposals

    def generation_done(self, group_id: str) -> None:
        """A generation group was read from the stream (trained, skipped or dropped)."""
        self.proposals.done(group_id)
