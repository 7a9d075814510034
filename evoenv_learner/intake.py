"""The group intake: each group read from the stream, or dropped where read, settled with the
orchestrator (its slot, its level, the funnel) and the pool (its gradings, a quarantine), and
whether it goes to the trainer (`settle_read`: True, or False when skipped or dropped);
staleness and quarantine checked again at the step that would use a group (`split_stale`,
`split_quarantined`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from evoenv_learner.consumer import Dropped
from evoenv_learner.grpo import group_advantages
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.pool import Pool
from shared.config import Settings
from shared.messages import GeneratorGroupData, GradedGroup

if TYPE_CHECKING:
    from evoenv_learner.loop import LearnerState

log = structlog.get_logger(__name__)


async def settle_read(
    group: GradedGroup,
    orchestrator: Orchestrator,
    pool: Pool,
    state: LearnerState,
    settings: Settings,
) -> bool:
    """Settle a group read from the stream with the orchestrator (its slot, its level, the
    funnel); True if it goes to the trainer, False if it is skipped (over the prompt budget,
    or no reward variance: nothing to learn from) or dropped: a solver group the grader saw
    its environment's scorer disagree with itself on (`dishonest`: the environment is
    quarantined, `Pool.record_dishonest`), or one of a quarantined environment, is never
    trained on (counted in `state.quarantined_dropped`)."""
    state.tokens += sum(len(c.token_ids) for c in group.completions)
    if isinstance(group.data, GeneratorGroupData):  # a generator group (its data says so)
        orchestrator.generation_done(group.group_id)
        _count(state.funnel, group.data.funnel)
    elif group.data.over_budget:
        orchestrator.over_budget(group.env_sha, group.difficulty)
        orchestrator.solver_settled(group.group_id, trained=False)
        return False
    elif group.data.dishonest or pool.quarantined(group.env_sha):
        why = group.data.dishonest
        if why is not None and group.env_sha in pool:
            await asyncio.to_thread(pool.record_dishonest, group.env_sha, why)
        orchestrator.solver_settled(group.group_id, trained=False)
        state.quarantined_dropped += 1
        log.warning(
            "group_dropped_quarantined",
            group=group.group_id,
            env=group.env_name,
            env_sha=group.env_sha,
            dishonest=why,
            count=state.quarantined_dropped,
        )
        return False
    rewards = [c.reward for c in group.completions]
    trainable = group_advantages(rewards, group.role, settings.grpo) is not None
    if group.role != "generator":
        await asyncio.to_thread(_record_gradings, pool, group)
        scored = [c for c in group.completions if c.reward is not None]
        orchestrator.record_outcome(
            group.env_sha,
            group.difficulty,
            sum(c.reward == 1.0 for c in scored),
            len(scored),
            spread=trainable,
        )
        orchestrator.solver_settled(group.group_id, trained=trainable)
    if not trainable:
        state.skipped_groups += 1
        log.info("group_skipped", group=group.group_id, role=group.role, rewards=rewards)
    return trainable


def settle_dropped(
    dropped: Sequence[Dropped], orchestrator: Orchestrator, funnel: dict[str, int]
) -> None:
    """Free the slots of groups the consumer dropped (stale, unreadable); a stale generation
    group's candidates were judged all the same, so its funnel counts."""
    for group in dropped:
        if group.role == "generator":
            orchestrator.generation_done(group.group_id)
            _count(funnel, group.funnel)
        else:
            orchestrator.solver_settled(group.group_id, trained=False)


def split_stale(
    batch: Sequence[GradedGroup], version: int, max_staleness: int, step: int
) -> tuple[list[GradedGroup], list[GradedGroup]]:
    """The groups of `batch` a step at policy `version` may train on, and those sampled more
    than `max_staleness` versions before it (each logged with its version and the step's)."""
    return _split(
        batch,
        lambda g: version - g.policy_version > max_staleness,
        "rollout_stale_at_step",
        step=step,
        step_version=version,
    )


def split_quarantined(
    batch: Sequence[GradedGroup], pool: Pool, step: int
) -> tuple[list[GradedGroup], list[GradedGroup]]:
    """The groups of `batch` a step may train on, and those of an environment quarantined since
    they were read (each logged with the step)."""
    return _split(
        batch,
        lambda g: g.role == "solver" and pool.quarantined(g.env_sha),
        "group_dropped_quarantined_at_step",
        step=step,
    )


def _split(
    batch: Sequence[GradedGroup], barred: Callable[[GradedGroup], bool], event: str, **fields: int
) -> tuple[list[GradedGroup], list[GradedGroup]]:
    """`batch` parted into the groups a step keeps and those `barred`, each of which is logged
    as `event` with `fields`."""
    kept, out = [], []
    for group in batch:
        if barred(group):
            out.append(group)
            log.info(
                event,
                group=group.group_id,
                role=group.role,
                env=group.env_name,
                env_sha=group.env_sha,
                version=group.policy_version,
                **fields,
            )
        else:
            kept.append(group)
    return kept, out


def _count(funnel: dict[str, int], outcomes: Sequence[str]) -> None:
    for outcome in outcomes:
        funnel[outcome] = funnel.get(outcome, 0) + 1


def _record_gradings(pool: Pool, group: GradedGroup) -> None:
    errors = sum(c.outcome == "env_error" for c in group.completions)
    passes = sum(c.reward == 1.0 for c in group.completions)
    if group.env_sha in pool:
        pool.record_gradings(
            group.env_sha,
            len(group.completions),
            errors,
            passes=passes,
            difficulty=group.difficulty,
            group_id=group.group_id,
        )
