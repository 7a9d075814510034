"""Held-out evaluation: the served policy on instances from the evaluation seed range, which
training never draws from. One completion per instance at temperature 0 (the policy's greedy
answer), graded in the sandbox like any group, on a stream of its own (`RUN-eval`) so it never
reaches training. Returns the pass rate per environment and overall."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_learner.orchestrator import Orchestrator, chain_results
from shared.config import Settings
from shared.environment import EVAL_SEEDS

if TYPE_CHECKING:
    from evoenv_learner.pool import PoolEntry

log = structlog.get_logger(__name__)


async def evaluate(
    settings: Settings,
    orchestrator: Orchestrator,
    stop: asyncio.Event,
    entries: list[PoolEntry] | None = None,
    difficulty: int | None = None,
    instances: int | None = None,
) -> dict[str, Any]:
    """Pass rate of the served policy on held-out instances of `entries` (default: the pool's
    members the learner trains on)."""
    wanted = set(settings.learner.environments)
    members = entries or [m for m in orchestrator.pool.members if not wanted or m.name in wanted]
    n = instances or settings.learner.eval_instances
    level = difficulty or settings.learner.eval_difficulty
    names: list[str] = []
    results: list[Any] = []
    for entry in members:
        for k in range(n):
            job = orchestrator.solver_job(
                entry,
                run=f"{settings.run}-eval",
                seed=EVAL_SEEDS.start + k,
                difficulty=level,
                group_size=1,
                temperature=0.0,
            )
            names.append(entry.name)
            results.append(orchestrator.send_chain(job))
    rewards: dict[str, list[float]] = {}
    for name, graded in zip(names, await chain_results(results, stop), strict=True):
        for reward in graded.get("rewards", []) if graded else []:
            if reward is not None:
                rewards.setdefault(name, []).append(float(reward == 1.0))
    return summarise(rewards)


def summarise(rewards: dict[str, list[float]]) -> dict[str, Any]:
    """Pass rate per environment and overall, with a 95 % Wilson interval on the overall one."""
    everything = [r for values in rewards.values() for r in values]
    total = len(everything)
    rate = sum(everything) / total if total else 0.0
    low, high = wilson(rate, total)
    out: dict[str, Any] = {"pass_rate": rate, "instances": total, "ci_low": low, "ci_high": high}
    for name, values in sorted(rewards.items()):
        out[f"pass_rate_{name}"] = sum(values) / len(values)
    return out


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
