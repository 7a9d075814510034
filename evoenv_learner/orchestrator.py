"""The orchestrator: keeps a bounded number of solver and generator groups in flight.

Solver side: pick an environment from the pool (seed floor, rotation), a training seed and its
serving difficulty, then the Celery chain sample (grading) -> complete (generation) -> grade
(grading), which appends one graded group to the rollout stream.

Which environment (beyond the reference design, `learner.solver_draw`): GRPO learns nothing
from a group whose answers all score alike, and at the start most groups are such (the 0.5B
solver scores 0 on every answer of 7 of the 10 seeds at their easiest level; in a 3-step
`evoenv up` on two cores 35 groups were skipped for 6 trained). The draw favours the
environments whose recent groups at their current level had reward spread: weight
`SPREAD_FLOOR` + (1 - `SPREAD_FLOOR`) x (k + 1) / (n + 2) for k of the last n (at most
`SPREAD_WINDOW`) groups, 0.55 for one not tried yet. The floor keeps every member drawn now
and then, so one the solver starts to solve (or fail) is noticed; a level that moves starts
its own count.

Generator side: a proposal prompt from a few pool members, sent to `propose` (generation),
whose candidates go through admission; the generation group lands in the stream when its last
candidate is done. Its slot is freed when it is read from the stream (trained, skipped or
dropped: `generation_done`), or when it cannot arrive: its proposal failed for good, or
`learner.generation_deadline` passed. Such a group is finalised as expired (`expire_group`:
its record closed, its candidates' archive records saying so, no reward), counted in the
funnel as G `expired` candidates and logged (`generation_group_expired`).

Serving difficulty (beyond the reference design): `search_serving` finds, for each admitted
environment in turn, the level whose solver pass rate is nearest the target (`difficulty.py`)
and records it in the pool with the measured curve; solver groups are then served at that level,
which `record_outcome` moves as the solver improves. Until its search ends an environment is
served at its calibration difficulty, which does not move. One search runs at a time (m
instances in flight at most), each round's instances graded on a stream of their own
(`RUN-serving`) that training never reads. The result lives in the archive, so a learner
restart searches again only the environments whose search had not finished. Seeds are not
searched (`awaits_search`). The admission gate and the generator's reward keep the fixed
calibration difficulty: nothing here touches them.

Synchronous mode (`learner.synchronous`, the baseline of bench/bench_async.py): rounds of
exactly `grpo.batch_groups` solver groups at the current policy version. A round's groups are
pending until the learner's consumer settles them (`solver_settled`: trained, or not trained
and replaced); nothing more is sent until the trainer says the batch was trained and its
weights pushed (`batch_trained`), which starts the next round at once. No generation groups.

Backpressure: nothing new is sent while the stream holds more unread groups than
`learner.stream_backlog`. The orchestrator never imports environment code: it reads the class
attributes it needs (name, oracle, difficulty range) from the source's syntax tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from evoenv_learner.difficulty import DifficultySearch, SearchResult
from evoenv_learner.pool import Pool, PoolEntry, draw
from shared.config import Settings
from shared.environment import TRAIN_SEEDS
from shared.messages import ProposalJob, SolverJob
from shared.proposal_prompt import TOPICS, Example, choose_examples, proposal_messages
from shared.static import check_static

log = structlog.get_logger(__name__)

LEVEL_WINDOW = 4
"""Solver groups observed at a level before it may move."""
LEVEL_BAND = 0.25
"""How far the pass rate may stray from the target before the level moves."""
SPREAD_WINDOW = 8
"""Solver groups per environment and level that the draw remembers (`draw_weight`)."""
SPREAD_FLOOR = 0.1
"""The least draw weight, whatever an environment's groups (1: uniform)."""
SEND_POLL_SECONDS = 0.5
"""How often `run` reaps finished chains and sends new groups (sooner when woken)."""
SEARCH_POLL_SECONDS = 5.0
"""How often `search_serving` looks again for an environment awaiting its search."""

Measure = Callable[[PoolEntry, int, asyncio.Event], Awaitable[float | None]]
"""The solver's pass rate on an environment at a level; None when the learner is stopping or
nothing could be measured (`Orchestrator.measure_pass_rate`; tests pass a fake)."""


@dataclass(frozen=True, slots=True)
class EnvInfo:
    oracle: str
    low: int
    high: int


@dataclass
class Orchestrator:
    settings: Settings
    pool: Pool
    backlog: Callable[[], Any]
    """Coroutine function: how many graded groups wait unread in the stream."""
    rng: random.Random = field(default_factory=random.Random)
    solver_in_flight: dict[str, Any] = field(default_factory=dict)
    generator_in_flight: dict[str, Any] = field(default_factory=dict)
    """Generation groups sent and not yet read: each one's `propose` AsyncResult."""
    expire_group: Callable[[str, str], bool] | None = None
    """Finalise a generation group as expired, given why (`generation.expire_group`, handed in
    by the command: `loop.GroupExpiry`); False when it completed first. None: only its slot is
    freed (tests, and `python -m evoenv_learner`)."""
    funnel: dict[str, int] = field(default_factory=dict)
    """Admission outcomes counted per candidate (the learner's funnel, shared with it)."""
    ceilings: dict[str, int] = field(default_factory=dict)
    """Per environment: the highest difficulty whose prompt fits the prompt budget."""
    sent: dict[str, int] = field(default_factory=lambda: {"solver": 0, "generator": 0})
    _info: dict[str, EnvInfo] = field(default_factory=dict)
    _sent_at: dict[str, float] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    """Per environment: the difficulty solver groups are served at now."""
    _outcomes: dict[str, list[float]] = field(default_factory=dict)
    spread: dict[str, list[int]] = field(default_factory=dict)
    """Per "SHA/LEVEL": 1 or 0 for each of its last `SPREAD_WINDOW` solver groups, as they had
    reward spread or not (kept in checkpoints)."""
    _search_given_up: set[str] = field(default_factory=set)
    """Environments whose search measured nothing in this process (searched again on restart)."""
    round_pending: set[str] = field(default_factory=set)
    """Synchronous mode: this round's solver groups sent and not yet settled."""
    round_trained: int = 0
    """Synchronous mode: this round's groups that went to the trainer."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Callable[[], float] = time.monotonic
    """Seconds for the groups' deadlines; the learner's stands still while the servers are
    paused (`shared.pauses.ServingClock`), so a push or a step taken in turns never makes a
    group overdue."""

    async def run(self, stop: asyncio.Event) -> None:
        synchronous = self.settings.learner.synchronous
        if synchronous and self.settings.learner.generator_groups_in_flight:
            log.warning("synchronous_mode", detail="no generation groups are sent")
        while not stop.is_set():
            self._reap()
            for group_id, reason in self._generation_lost():
                await self._expire_generation(group_id, reason)
            if await self.backlog() < self.settings.learner.stream_backlog:
                for _ in range(self.solver_wanted()):
                    self._send_solver()
                while not synchronous and (
                    len(self.generator_in_flight) < self.settings.learner.generator_groups_in_flight
                ):
                    self._send_generator()
            await self._pause(stop, SEND_POLL_SECONDS)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        """Until `stop`, `batch_trained` or `seconds` have passed, whichever comes first."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self._wake.clear()

    def solver_wanted(self) -> int:
        """Solver groups to send now: up to `solver_groups_in_flight` in flight; in synchronous
        mode, what the round lacks of `grpo.batch_groups` (settled untrained ones replaced)."""
        if self.settings.learner.synchronous:
            have = self.round_trained + len(self.round_pending)
            return max(0, self.settings.grpo.batch_groups - have)
        return max(0, self.settings.learner.solver_groups_in_flight - len(self.solver_in_flight))

    def solver_settled(self, group_id: str, trained: bool) -> None:
        """A solver group reached the learner: queued for training, or left out (no reward
        variance, over budget). Synchronous mode counts it in its round, or replaces it."""
        if group_id in self.round_pending:
            self.round_pending.discard(group_id)
            self.round_trained += trained
            if not trained:
                self._wake.set()

    def dropped_at_step(self, groups: int) -> None:
        """Groups counted as trained were dropped at the step (stale by then): synchronous
        mode replaces them in their round."""
        if self.settings.learner.synchronous:
            self.round_trained = max(0, self.round_trained - groups)
            self._wake.set()

    def batch_trained(self) -> None:
        """The trainer took a batch, stepped and pushed: synchronous mode's next round."""
        if self.settings.learner.synchronous:
            self.round_trained = max(0, self.round_trained - self.settings.grpo.batch_groups)
            self._wake.set()

    def groups_in_flight(self) -> int:
        """Solver and generator groups sent and not yet back: a solver group until its chain
        ends (its group then waits in the stream), a generation group until it is read."""
        return len(self.solver_in_flight) + len(self.generator_in_flight)

    def generation_done(self, group_id: str) -> None:
        """A generation group was read from the stream (trained, skipped or dropped)."""
        self.generator_in_flight.pop(group_id, None)
        self._sent_at.pop(group_id, None)

    def over_budget(self, env_sha: str, difficulty: int) -> None:
        """A prompt at `difficulty` did not fit: serve this environment one level easier."""
        info = self._info.get(env_sha)
        low = info.low if info else 1
        self.ceilings[env_sha] = max(
            low, min(self.ceilings.get(env_sha, difficulty), difficulty - 1)
        )

    # ---------------------------------------------------------------------------- solver

    def _reap(self) -> None:
        patience = (
            self.settings.worker.complete_time_limit + 2 * self.settings.worker.grade_time_limit
        )
        now = self.clock()
        for group_id, result in list(self.solver_in_flight.items()):
            if now - self._sent_at.get(group_id, now) > patience:
                # Its job is waiting for redelivery (a worker died): stop counting it as in
                # flight; if it completes later it still lands in the stream, once.
                del self.solver_in_flight[group_id]
                self._sent_at.pop(group_id, None)
                self.round_pending.discard(group_id)  # replaced in its round
                log.warning("solver_group_overdue", group_id=group_id, seconds=round(patience))
            elif result.ready():
                del self.solver_in_flight[group_id]
                self._sent_at.pop(group_id, None)
                if result.failed():
                    self.round_pending.discard(group_id)  # it never reaches the stream
                    log.warning(
                        "solver_group_failed", group_id=group_id, error=str(result.result)[:300]
                    )

    def _choose(self) -> PoolEntry:
        """The pool's draw (seed floor, rotation), weighted by `draw_weight` unless
        `learner.solver_draw` is uniform; with `learner.environments` set, among those (the seed
        floor then does not apply)."""
        weight = self.draw_weight if self.settings.learner.solver_draw == "spread" else None
        wanted = set(self.settings.learner.environments)
        if not wanted:
            return self.pool.choose(self.rng, weight)
        members = [m for m in self.pool.members if m.name in wanted]
        if not members:
            raise LookupError(f"none of {sorted(wanted)} is an active member of the pool")
        return draw(members, self.rng, weight)

    def draw_weight(self, entry: PoolEntry) -> float:
        """How strongly the solver draw favours `entry` (module doc): from the share of its
        recent groups at the level it is served at now that had reward spread."""
        seen = self.spread.get(_spread_key(entry.sha, self.difficulty(entry)), [])
        share = (sum(seen) + 1) / (len(seen) + 2)
        return SPREAD_FLOOR + (1.0 - SPREAD_FLOOR) * share

    def info(self, entry: PoolEntry) -> EnvInfo:
        if entry.sha not in self._info:
            static = check_static(entry.source.encode(), self.settings.validation.max_source_bytes)
            self._info[entry.sha] = EnvInfo(static.oracle, *static.difficulties)
        return self._info[entry.sha]

    def difficulty(self, entry: PoolEntry) -> int:
        """The fixed difficulty if configured; else the level tracked for this environment,
        starting at its serving (or calibration) difficulty, or its easiest level.

        An environment awaiting its search stays at its calibration difficulty, untracked, so
        that neither the level adaptation nor a level restored from a checkpoint written before
        the search ended can override the search's result."""
        info = self.info(entry)
        if self.settings.learner.difficulty:
            level = self.settings.learner.difficulty
        elif self.awaits_search(entry):
            level = entry.difficulty or info.low
        else:
            level = self.levels.setdefault(entry.sha, entry.difficulty or info.low)
        level = min(level, self.ceilings.get(entry.sha, info.high))
        return max(info.low, min(info.high, level))

    def record_outcome(
        self, env_sha: str, difficulty: int, passes: int, total: int, *, spread: bool | None = None
    ) -> None:
        """Move an environment's level with the solver (beyond the reference design): after
        `LEVEL_WINDOW` groups at its level, one level harder when the pass rate is above
        `target + LEVEL_BAND`, one easier when below `target - LEVEL_BAND`. `spread`: whether
        the group's rewards differed (for the draw, `draw_weight`)."""
        if spread is not None:
            recent = self.spread.setdefault(_spread_key(env_sha, difficulty), [])
            recent.append(int(spread))
            del recent[:-SPREAD_WINDOW]
        if self.settings.learner.difficulty or total == 0 or self.levels.get(env_sha) != difficulty:
            return
        window = self._outcomes.setdefault(env_sha, [])
        window.append(passes / total)
        if len(window) < LEVEL_WINDOW:
            return
        rate = sum(window) / len(window)
        target = self.settings.admission.target_pass_rate
        info = self._info.get(env_sha)
        low, high = (info.low, info.high) if info else (difficulty, difficulty)
        if rate > target + LEVEL_BAND and difficulty < high:
            self.levels[env_sha] = difficulty + 1
        elif rate < target - LEVEL_BAND and difficulty > low:
            self.levels[env_sha] = difficulty - 1
        if self.levels[env_sha] != difficulty:
            log.info(
                "difficulty_moved",
                env_sha=env_sha,
                old=difficulty,
                new=self.levels[env_sha],
                pass_rate=round(rate, 3),
            )
        window.clear()

    def solver_job(
        self,
        entry: PoolEntry,
        *,
        run: str | None = None,
        seed: int | None = None,
        difficulty: int | None = None,
        group_size: int | None = None,
        temperature: float | None = None,
    ) -> SolverJob:
        g = self.settings.grpo
        return SolverJob(
            run=run or self.settings.run,
            group_id=uuid.uuid4().hex,
            env=entry.ref(),
            seed=self.rng.randrange(TRAIN_SEEDS.start, TRAIN_SEEDS.stop) if seed is None else seed,
            difficulty=self.difficulty(entry) if difficulty is None else difficulty,
            group_size=group_size or g.group_size,
            temperature=g.temperature if temperature is None else temperature,
            max_tokens=g.max_tokens,
            prompt_budget=self.settings.learner.prompt_budget,
        )

    def send_chain(self, job: SolverJob) -> Any:
        """Send `job` down the chain sample -> complete -> grade; the chain's AsyncResult."""
        from evoenv_learner import jobs

        payload = job.model_dump(mode="json")
        return jobs.send_chain(("evoenv.sample", "evoenv.complete", "evoenv.grade"), payload)

    def _send_solver(self) -> None:
        job = self.solver_job(self._choose())
        result = self.send_chain(job)
        self.solver_in_flight[job.group_id] = result
        self._sent_at[job.group_id] = self.clock()
        if self.settings.learner.synchronous:
            self.round_pending.add(job.group_id)
        self.pool.record_use(job.env.sha)
        self.sent["solver"] += 1

    # ---------------------------------------------------------------- serving difficulty

    def awaits_search(self, entry: PoolEntry) -> bool:
        """Whether `entry` is to be searched before it is served at a level that moves.

        Seeds are not searched: they start at their easiest level and climb with the level
        adaptation, as before (searching all ten would cost rounds x m completions each before
        training starts on every fresh archive). Nothing is searched with a fixed
        `learner.difficulty` or with `admission.serving_rounds` at 0."""
        return (
            self.settings.admission.serving_rounds > 0
            and not self.settings.learner.difficulty
            and not entry.is_seed
            and not entry.searched
            and entry.sha not in self._search_given_up
        )

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
                    if (not wanted or m.name in wanted) and self.awaits_search(m)
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
        info = self.info(entry)
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
            self._search_given_up.add(entry.sha)
            log.warning(
                "serving_search_given_up", env=entry.name, env_sha=entry.sha, level=search.start
            )
            return None
        result = search.result()
        await asyncio.to_thread(
            self.pool.set_serving_difficulty, entry.sha, result.level, result.curve
        )
        self.levels[entry.sha] = result.level
        self._outcomes.pop(entry.sha, None)
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
            self.solver_job(
                entry, run=f"{self.settings.run}-serving", difficulty=level, group_size=1
            )
            for _ in range(self.settings.admission.calibration_instances)
        ]
        graded = await chain_results([self.send_chain(job) for job in jobs], stop)
        if stop.is_set():
            return None
        passes: list[float] = []
        for result in graded:
            if result is not None:
                rewards = result.get("rewards") or [0.0]
                passes += [float(reward == 1.0) for reward in rewards if reward is not None]
        return sum(passes) / len(passes) if passes else None

    # ---------------------------------------------------------------------------- generator

    def _generation_lost(self) -> list[tuple[str, str]]:
        """Generation groups that cannot arrive, and why: the proposal failed for good, or the
        group is past `learner.generation_deadline` (a job lost, a stage that never ended)."""
        deadline = self.settings.learner.generation_deadline
        now = self.clock()
        lost = []
        for group_id, result in self.generator_in_flight.items():
            if result is not None and result.ready() and result.failed():
                lost.append((group_id, f"its proposal failed: {str(result.result)[:300]}"))
            elif now - self._sent_at.get(group_id, now) > deadline:
                lost.append((group_id, f"not in the stream {deadline:g} s after it was sent"))
        return lost

    async def _expire_generation(self, group_id: str, reason: str) -> None:
        """Stop waiting for a generation group: free its slot and finalise it as expired
        (unless it completed meanwhile: then it is trained if it arrives, like any other)."""
        self.generator_in_flight.pop(group_id, None)
        self._sent_at.pop(group_id, None)
        expired = True
        if self.expire_group is not None:
            expired = await asyncio.to_thread(self.expire_group, group_id, reason)
        if not expired:
            log.warning("generation_group_overdue", group_id=group_id, reason=reason)
            return
        size = self.settings.grpo.group_size
        self.funnel["expired"] = self.funnel.get("expired", 0) + size
        log.warning("generation_group_expired", group_id=group_id, reason=reason, candidates=size)

    def send_proposal(self, job: ProposalJob) -> Any:
        """Send `job` to `propose`; its AsyncResult."""
        from evoenv_learner import jobs

        return jobs.send("evoenv.propose", job.model_dump(mode="json"))

    def _send_generator(self) -> None:
        members = self.pool.members
        examples = choose_examples(
            [Example(m.name, self.info(m).oracle, m.source, m.sha, m.solve_rate) for m in members],
            self.settings.learner.proposal_examples,
            self.rng,
        )
        topic = self.rng.choice(TOPICS) if self.settings.learner.proposal_topics else ""
        g = self.settings.grpo
        job = ProposalJob(
            run=self.settings.run,
            group_id=uuid.uuid4().hex,
            messages=proposal_messages(examples, topic),
            parents=[e.sha for e in examples],
            group_size=g.group_size,
            temperature=g.generator_temperature,
            max_tokens=g.generator_max_tokens,
        )
        self.generator_in_flight[job.group_id] = self.send_proposal(job)
        self._sent_at[job.group_id] = self.clock()
        self.sent["generator"] += 1
        log.info(
            "generation_group_sent",
            group_id=job.group_id,
            examples=[e.name for e in examples],
            topic=topic,
            solve_rates=[
                None if e.solve_rate is None else round(e.solve_rate, 3) for e in examples
            ],
        )


def _spread_key(env_sha: str, difficulty: int) -> str:
    return f"{env_sha}/{difficulty}"


async def chain_results(results: list[Any], stop: asyncio.Event) -> list[dict[str, Any] | None]:
    """Wait for the chains of `results` (their AsyncResults); each one's grade result, or None
    where the chain failed. The delivery rules see that every chain ends (a job lost with its
    worker is redelivered, one failing for good is dead-lettered); those not ended when `stop`
    is set are None too."""
    ended: dict[int, dict[str, Any] | None] = {}
    while len(ended) < len(results) and not stop.is_set():
        for k, result in enumerate(results):
            if k not in ended and result.ready():
                ended[k] = result.result if result.successful() else None
        if len(ended) < len(results):
            await asyncio.sleep(0.5)
    return [ended.get(k) for k in range(len(results))]
