"""Solver dispatch: which environment a solver group is drawn from, the job sent down the chain
sample -> complete -> grade, the groups in flight until their chains end, and synchronous
mode's rounds."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from evoenv_learner.levels import LevelTracker
from evoenv_learner.pool import Pool, PoolEntry, draw
from shared.config import Settings
from shared.environment import TRAIN_SEEDS
from shared.messages import SolverJob

log = structlog.get_logger(__name__)


@dataclass
class SolverDispatch:
    """Sends solver groups: an environment from the pool (seed floor, rotation, the draw
    weighted by `LevelTracker.draw_weight`), a training seed and the level it is served at,
    then the Celery chain sample (grading) -> complete (generation) -> grade (grading), which
    appends one graded group to the rollout stream. A group is in flight until its chain ends
    (it then waits in the stream), fails, or is overdue (`reap`).

    Synchronous mode (`learner.synchronous`, the baseline of bench/bench_async.py): rounds of
    exactly `grpo.batch_groups` solver groups at the current policy version. A round's groups
    are pending until the learner's consumer settles them (`settled`: trained, or not trained
    and replaced); nothing more is sent until the trainer says the batch was trained and its
    weights pushed (`batch_trained`), which starts the next round at once (`wake`)."""

    settings: Settings
    pool: Pool
    tracker: LevelTracker
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    """Seconds for the groups' deadlines (`Orchestrator.clock`)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when synchronous mode wants groups sent at once (the orchestrator's poll waits on
    it)."""
    in_flight: dict[str, Any] = field(default_factory=dict)
    """Solver groups sent whose chains have not ended: each one's chain AsyncResult."""
    sent_at: dict[str, float] = field(default_factory=dict)
    round_pending: set[str] = field(default_factory=set)
    """Synchronous mode: this round's solver groups sent and not yet settled."""
    round_trained: int = 0
    """Synchronous mode: this round's groups that went to the trainer."""

    def wanted(self) -> int:
        """Solver groups to send now: up to `solver_groups_in_flight` in flight; in synchronous
        mode, what the round lacks of `grpo.batch_groups` (settled untrained ones replaced)."""
        if self.settings.learner.synchronous:
            have = self.round_trained + len(self.round_pending)
            return max(0, self.settings.grpo.batch_groups - have)
        return max(0, self.settings.learner.solver_groups_in_flight - len(self.in_flight))

    def settled(self, group_id: str, trained: bool) -> None:
        """A solver group reached the learner: queued for training, or left out (no reward
        variance, over budget). Synchronous mode counts it in its round, or replaces it."""
        if group_id in self.round_pending:
            self.round_pending.discard(group_id)
            self.round_trained += trained
            if not trained:
                self.wake.set()

    def dropped_at_step(self, groups: int) -> None:
        """Groups counted as trained were dropped at the step (stale by then): synchronous
        mode replaces them in their round."""
        if self.settings.learner.synchronous:
            self.round_trained = max(0, self.round_trained - groups)
            self.wake.set()

    def batch_trained(self) -> None:
        """The trainer took a batch, stepped and pushed: synchronous mode's next round."""
        if self.settings.learner.synchronous:
            self.round_trained = max(0, self.round_trained - self.settings.grpo.batch_groups)
            self.wake.set()

    def reap(self) -> None:
        """Stop counting the groups whose chains ended (failed or not) or that are overdue."""
        patience = (
            self.settings.worker.complete_time_limit + 2 * self.settings.worker.grade_time_limit
        )
        now = self.clock()
        for group_id, result in list(self.in_flight.items()):
            if now - self.sent_at.get(group_id, now) > patience:
                # Its job is waiting for redelivery (a worker died): stop counting it as in
                # flight; if it completes later it still lands in the stream, once.
                del self.in_flight[group_id]
                self.sent_at.pop(group_id, None)
                self.round_pending.discard(group_id)  # replaced in its round
                log.warning("solver_group_overdue", group_id=group_id, seconds=round(patience))
            elif result.ready():
                del self.in_flight[group_id]
                self.sent_at.pop(group_id, None)
                if result.failed():
                    self.round_pending.discard(group_id)  # it never reaches the stream
                    log.warning(
                        "solver_group_failed", group_id=group_id, error=str(result.result)[:300]
                    )

    def choose(self) -> PoolEntry:
        """The pool's draw (seed floor, rotation), weighted by `draw_weight` unless
        `learner.solver_draw` is uniform; with `learner.environments` set, among those (the seed
        floor then does not apply)."""
        weight = self.tracker.draw_weight if self.settings.learner.solver_draw == "spread" else None
        wanted = set(self.settings.learner.environments)
        if not wanted:
            return self.pool.choose(self.rng, weight)
        members = [m for m in self.pool.members if m.name in wanted]
        if not members:
            raise LookupError(f"none of {sorted(wanted)} is an active member of the pool")
        return draw(members, self.rng, weight)

    def solver_job(
        self,
        entry: PoolEntry,
        *,
        run: str | None = None,
        seed: int | None = None,
        difficulty: int | None = None,
        group_size: int | None = None,
        temperature: float | None = None,
        lenient: bool = False,
    ) -> SolverJob:
        g = self.settings.grpo
        return SolverJob(
            run=run or self.settings.run,
            group_id=uuid.uuid4().hex,
            env=entry.ref(),
            seed=self.rng.randrange(TRAIN_SEEDS.start, TRAIN_SEEDS.stop) if seed is None else seed,
            difficulty=self.tracker.difficulty(entry) if difficulty is None else difficulty,
            group_size=group_size or g.group_size,
            temperature=g.temperature if temperature is None else temperature,
            max_tokens=g.max_tokens,
            prompt_budget=self.settings.learner.prompt_budget,
            lenient=lenient,
        )

    def send_chain(self, job: SolverJob) -> Any:
        """Send `job` down the chain sample -> complete -> grade; the chain's AsyncResult."""
        from evoenv_learner import jobs

        payload = job.model_dump(mode="json")
        return jobs.send_chain(("evoenv.sample", "evoenv.complete", "evoenv.grade"), payload)

    def send(self) -> None:
        """Send one solver group, drawn and served as above."""
        job = self.solver_job(self.choose())
        result = self.send_chain(job)
        self.in_flight[job.group_id] = result
        self.sent_at[job.group_id] = self.clock()
        if self.settings.learner.synchronous:
            self.round_pending.add(job.group_id)
        self.pool.record_use(job.env.sha)


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
