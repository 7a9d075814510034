"""Proposals: generation groups sent to `propose`, each in a proposal mode
(docs/DESIGN.md#proposal-modes), held in flight until read from the stream, and expired when
they cannot arrive."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from evoenv_learner.levels import LevelTracker
from evoenv_learner.pool import Pool
from shared.config import Settings
from shared.messages import ProposalJob, ProposalMode
from shared.proposal_modes import draw_mode, mutation_messages, own_task_messages
from shared.proposal_prompt import TOPICS, Example, choose_examples, proposal_messages

log = structlog.get_logger(__name__)

REPAIR_QUEUE = 16
"""Generation groups read and not yet repaired that the learner remembers (the newest)."""


@dataclass
class Proposals:
    """Generator side: a proposal prompt in a mode drawn from `learner.proposal_modes` (a
    topic, a mutation or an own task from a few pool members; a repair of a group read),
    sent to `propose` (generation), whose candidates go through admission; the generation
    group lands in the stream when its last candidate is done. Its slot is freed when it is read from the stream
    (trained, skipped or dropped: `done`), or when it cannot arrive: its proposal failed for
    good, or `learner.generation_deadline` passed. Such a group is finalised as expired
    (`expire_group`: its record closed, its candidates' archive records saying so, no reward),
    counted in the funnel as G `expired` candidates and logged (`generation_group_expired`)."""

    settings: Settings
    pool: Pool
    tracker: LevelTracker
    """Reads each example's oracle (`LevelTracker.info`)."""
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    """Seconds for the groups' deadlines (`Orchestrator.clock`)."""
    expire_group: Callable[[str, str], bool] | None = None
    """Finalise a generation group as expired, given why (`Orchestrator.expire_group`); False
    when it completed first. None: only its slot is freed."""
    funnel: dict[str, int] = field(default_factory=dict)
    """Admission outcomes counted per candidate (the learner's funnel, shared with it)."""
    in_flight: dict[str, Any] = field(default_factory=dict)
    """Generation groups sent and not yet read: each one's `propose` AsyncResult."""
    sent_at: dict[str, float] = field(default_factory=dict)
    modes: dict[str, ProposalMode] = field(default_factory=dict)
    """Each generation group in flight: its proposal mode."""
    to_repair: deque[str] = field(default_factory=lambda: deque(maxlen=REPAIR_QUEUE))
    """Generation groups read (not repair groups), newest last: a `repair` draw takes the
    newest, each at most once."""

    def done(self, group_id: str) -> None:
        """A generation group was read from the stream (trained, skipped or dropped); one not
        itself a repair group may now be repaired."""
        self.in_flight.pop(group_id, None)
        self.sent_at.pop(group_id, None)
        mode = self.modes.pop(group_id, None)
        if mode is not None and mode != "repair":
            self.to_repair.append(group_id)

    async def expire_lost(self) -> None:
        """Release every generation group that sent no candidates (a repair group with
        nothing to repair: nothing will arrive, nothing was judged), and expire every one
        that cannot arrive (`lost`)."""
        for group_id in self.empty():
            self.in_flight.pop(group_id, None)
            self.sent_at.pop(group_id, None)
            self.modes.pop(group_id, None)
            log.info("generation_group_empty", group_id=group_id, detail="nothing to repair")
        for group_id, reason in self.lost():
            await self.expire(group_id, reason)

    def empty(self) -> list[str]:
        """Repair groups whose proposal finished without a candidate (`propose` returned no
        validation job: none of the group it repairs failed L1-L5)."""
        return [
            group_id
            for group_id, result in self.in_flight.items()
            if self.modes.get(group_id) == "repair"
            and result is not None
            and result.ready()
            and result.successful()
            and not result.result
        ]

    def lost(self) -> list[tuple[str, str]]:
        """Generation groups that cannot arrive, and why: the proposal failed for good, or the
        group is past `learner.generation_deadline` (a job lost, a stage that never ended)."""
        deadline = self.settings.learner.generation_deadline
        now = self.clock()
        lost = []
        for group_id, result in self.in_flight.items():
            if result is not None and result.ready() and result.failed():
                lost.append((group_id, f"its proposal failed: {str(result.result)[:300]}"))
            elif now - self.sent_at.get(group_id, now) > deadline:
                lost.append((group_id, f"not in the stream {deadline:g} s after it was sent"))
        return lost

    async def expire(self, group_id: str, reason: str) -> None:
        """Stop waiting for a generation group: free its slot and finalise it as expired
        (unless it completed meanwhile: then it is trained if it arrives, like any other)."""
        self.in_flight.pop(group_id, None)
        self.sent_at.pop(group_id, None)
        mode = self.modes.pop(group_id, None)
        expired = True
        if self.expire_group is not None:
            expired = await asyncio.to_thread(self.expire_group, group_id, reason)
        if not expired:
            log.warning("generation_group_overdue", group_id=group_id, reason=reason)
            return
        # a repair group has as many candidates as its group had L1-L5 failures: not known here
        size = 0 if mode == "repair" else self.settings.grpo.group_size
        self.funnel["expired"] = self.funnel.get("expired", 0) + size
        log.warning("generation_group_expired", group_id=group_id, reason=reason, candidates=size)

    def send_proposal(self, job: ProposalJob) -> Any:
        """Send `job` to `propose`; its AsyncResult."""
        from evoenv_learner import jobs

        return jobs.send("evoenv.propose", job.model_dump(mode="json"))

    def send(self) -> None:
        """Send one generation group in a mode drawn from `learner.proposal_modes`."""
        learner, g = self.settings.learner, self.settings.grpo
        mode = draw_mode(learner.proposal_modes, self.rng, can_repair=bool(self.to_repair))
        k = 1 if mode == "mutation" else learner.proposal_examples
        examples = [] if mode == "repair" else self.examples(k)
        topic = self.rng.choice(TOPICS) if mode == "topic" and learner.proposal_topics else ""
        repair_of = self.to_repair.pop() if mode == "repair" else None
        job = ProposalJob(
            run=self.settings.run,
            group_id=uuid.uuid4().hex,
            messages=self.messages(mode, examples, topic),
            parents=[e.sha for e in examples],
            group_size=g.group_size,
            temperature=g.generator_temperature,
            max_tokens=g.generator_max_tokens,
            mode=mode,
            repair_of=repair_of,
        )
        self.in_flight[job.group_id] = self.send_proposal(job)
        self.sent_at[job.group_id] = self.clock()
        self.modes[job.group_id] = mode
        log.info(
            "generation_group_sent",
            group_id=job.group_id,
            mode=mode,
            repair_of=repair_of,
            examples=[e.name for e in examples],
            topic=topic,
            solve_rates=[
                None if e.solve_rate is None else round(e.solve_rate, 3) for e in examples
            ],
        )

    def examples(self, k: int) -> list[Example]:
        """`k` pool members drawn as examples, favouring the solver's frontier."""
        pool = [
            Example(m.name, self.tracker.info(m).oracle, m.source, m.sha, m.solve_rate)
            for m in self.pool.members
        ]
        return choose_examples(pool, k, self.rng)

    @staticmethod
    def messages(mode: ProposalMode, examples: list[Example], topic: str) -> list[dict[str, str]]:
        """The proposal prompt of `mode` (a repair's prompts are built by the worker, from the
        record of the group it repairs: none here)."""
        if mode == "mutation":
            return mutation_messages(examples[0])
        if mode == "own_task":
            return own_task_messages(examples)
        if mode == "repair":
            return []
        return proposal_messages(examples, topic)
