"""Held-out evaluation: the served policy on instances from the evaluation seed range, which
training never draws from. One greedy completion per instance, graded in the sandbox like any
group (and its answer taken leniently too), on a stream of its own (`RUN-eval`) so it never
reaches training. What it returns: see `evaluate`.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_learner.dispatch import SolverDispatch, chain_results
from shared.config import Settings
from shared.environment import EVAL_SEEDS
from shared.messages import ConstantBaseline, ConstantJob, SolverJob

if TYPE_CHECKING:
    from evoenv_learner.pool import PoolEntry

Record = dict[str, Any]
"""One counted instance: {"seed", "reward", "answer", "lenient_reward", "lenient_answer",
"reference", "constant_reward"}."""

log = structlog.get_logger(__name__)


async def evaluate(
    settings: Settings,
    solvers: SolverDispatch,
    stop: asyncio.Event,
    entries: list[PoolEntry] | None = None,
    difficulty: int | None = None,
    instances: int | None = None,
    baseline: bool = False,
    first: int = 0,
) -> dict[str, Any]:
    """Pass rate of the served policy on held-out instances of `entries` (default: the pool's
    members the learner trains on): the evaluation seeds from the `first`-th on; with
    `baseline`, the best constant answers and the per-instance records too.

    One completion per instance at temperature 0 (the policy's greedy answer). Returns one dict
    (what `evoenv eval --json` prints); an instance counts when it has a reward, and passes
    when that reward is exactly 1.0. Beside each strict pass rate, its lenient one: the same
    instances, passing when the answer taken leniently (`extract_lenient`: the tagged answer,
    else the completion's last line) scores exactly 1.0, by the environment's scorer in the
    sandbox (`grade.lenient_rewards`); strict counts format and content together, lenient
    mostly the content:

    - `pass_rate`, `instances`, `ci_low`, `ci_high`, `lenient_pass_rate`, `lenient_ci_low`,
      `lenient_ci_high`: over all environments (95 % Wilson intervals);
    - `pass_rate_NAME`: each environment's pass rate (flat, as the archive's eval rows and the
      report have always read it);
    - `environments`: {NAME: {"pass_rate", "instances", "ci_low", "ci_high",
      "lenient_pass_rate", "lenient_ci_low", "lenient_ci_high"}}, one object per environment
      with counted instances, with its own 95 % Wilson intervals.

    With `baseline` (`evoenv eval` and the learner's evaluations set it), `constant_pass_rate`
    is the best constant answers' pass rate over the same instances (each environment's own
    constant; absent when one could not be found), and each
    environment's object also holds the best constant answer (`shared/baseline.py`) on exactly
    the instances counted, found by one `constant_baseline` job in the sandbox, and the
    per-instance records it was found from; without it these two keys are absent (absent: not
    asked; None: asked but not found):

    - `best_constant`: {"answer": str, "score": float} (score: the share of the instances the
      constant passes, as `pass_rate` counts the policy's), or None when the job failed;
    - `records`: one {"seed", "reward", "answer", "lenient_reward", "lenient_answer",
      "reference", "constant_reward"} per counted instance, in seed order: the policy's reward
      and extracted answer text (None: no answer span), the same for its answer taken
      leniently, the reference answer text and the best constant's reward (None when the job
      failed). The instances the best constant does not pass (constant_reward != 1.0) are the
      non-modal ones.
    """
    wanted = set(settings.learner.environments)
    members = entries or [m for m in solvers.pool.members if not wanted or m.name in wanted]
    n = instances or settings.learner.eval_instances
    level = difficulty or settings.learner.eval_difficulty
    jobs: list[tuple[PoolEntry, SolverJob]] = []
    for entry in members:
        for k in range(n):
            job = solvers.solver_job(
                entry,
                run=f"{settings.run}-eval",
                seed=EVAL_SEEDS.start + first + k,
                difficulty=level,
                group_size=1,
                temperature=0.0,
                lenient=True,
            )
            jobs.append((entry, job))
    graded = await chain_results([solvers.send_chain(job) for _, job in jobs], stop)
    records = counted(jobs, graded)
    passes = {name: [float(r["reward"] == 1.0) for r in rs] for name, rs in records.items()}
    lenient = {
        name: [float(r["lenient_reward"] == 1.0) for r in rs] for name, rs in records.items()
    }
    out = summarise(passes, lenient)
    out["environments"] = per_environment(passes, lenient)
    if baseline:
        for name, found in (await with_baselines(jobs, records, stop)).items():
            out["environments"][name].update(found)
        rate = constant_rate(out["environments"])
        if rate is not None:
            out["constant_pass_rate"] = rate
    return out


def constant_rate(environments: dict[str, dict[str, Any]]) -> float | None:
    """The best constant answers' pass rate over all the environments' counted instances
    (each environment's own constant, weighed by its instances); None unless every one has a
    constant."""
    found = [e for e in environments.values() if e.get("best_constant") is not None]
    if not found or len(found) != len(environments):
        return None
    total = sum(e["instances"] for e in found)
    return sum(e["best_constant"]["score"] * e["instances"] for e in found) / total


def counted(
    jobs: list[tuple[PoolEntry, SolverJob]], graded: list[dict[str, Any] | None]
) -> dict[str, list[Record]]:
    """Per environment, a record of each instance that has a reward (the pass rate's
    instances), in seed order; the reference and the constant's reward still None. A result
    without lenient rewards (a worker that does not take answers leniently) gives the strict
    ones."""
    records: dict[str, list[Record]] = {}
    for (entry, job), result in zip(jobs, graded, strict=True):
        rewards = result.get("rewards", []) if result else []
        answers = result.get("answers", []) if result else []
        lenient_rewards = (result or {}).get("lenient_rewards", rewards)
        lenient_answers = (result or {}).get("lenient_answers", answers)
        for reward, answer, lenient_reward, lenient_answer in zip(
            rewards, answers, lenient_rewards, lenient_answers, strict=True
        ):
            if reward is not None:
                records.setdefault(entry.name, []).append(
                    {
                        "seed": job.seed,
                        "reward": float(reward),
                        "answer": answer,
                        "lenient_reward": float(lenient_reward or 0.0),
                        "lenient_answer": lenient_answer,
                        "reference": None,
                        "constant_reward": None,
                    }
                )
    return records


async def with_baselines(
    jobs: list[tuple[PoolEntry, SolverJob]], records: dict[str, list[Record]], stop: asyncio.Event
) -> dict[str, Any]:
    """{NAME: {"best_constant", "records"}} of every environment with counted instances (see
    `evaluate`): one `constant_baseline` job each, all in flight together."""
    from evoenv_learner.jobs import send as send_job

    first_jobs: dict[str, tuple[PoolEntry, SolverJob]] = {}
    for entry, job in jobs:
        first_jobs.setdefault(entry.name, (entry, job))
    names = [name for name in first_jobs if name in records]
    sent: list[Any] = []
    for name in names:
        entry, job = first_jobs[name]
        constant_job = ConstantJob(
            env=entry.ref(),
            seeds=[r["seed"] for r in records[name]],
            difficulty=job.difficulty,
            answers=[r["answer"] for r in records[name] if r["answer"] is not None],
        )
        sent.append(send_job("evoenv.constant_baseline", constant_job.model_dump(mode="json")))
    out: dict[str, dict[str, Any]] = {}
    for name, result in zip(names, await chain_results(sent, stop), strict=True):
        found = (
            ConstantBaseline.model_validate(result)
            if result
            else ConstantBaseline(error="the job failed (see the dead letters) or was stopped")
        )
        if found.error is not None:
            log.warning("baseline_failed", env=name, error=found.error)
        else:
            for record, reference, reward in zip(
                records[name], found.references, found.rewards, strict=True
            ):
                record.update(reference=reference, constant_reward=reward)
        out[name] = {
            "best_constant": (
                None if found.error is not None else {"answer": found.answer, "score": found.score}
            ),
            "records": records[name],
        }
    return out


def summarise(
    rewards: dict[str, list[float]], lenient: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    """Pass rate per environment and overall, with a 95 % Wilson interval on the overall one;
    with `lenient` (the same instances' lenient passes), the overall lenient rate and its
    interval too."""
    everything = [r for values in rewards.values() for r in values]
    total = len(everything)
    rate = sum(everything) / total if total else 0.0
    low, high = wilson(rate, total)
    out: dict[str, Any] = {"pass_rate": rate, "instances": total, "ci_low": low, "ci_high": high}
    if lenient is not None:
        out |= _lenient_rate([r for values in lenient.values() for r in values])
    for name, values in sorted(rewards.items()):
        out[f"pass_rate_{name}"] = sum(values) / len(values)
    return out


def per_environment(
    rewards: dict[str, list[float]], lenient: dict[str, list[float]] | None = None
) -> dict[str, dict[str, Any]]:
    """{NAME: {"pass_rate", "instances", "ci_low", "ci_high"}}, by name, of every environment with
    rewards: its pass rate with its own 95 % Wilson interval; with `lenient`, also
    "lenient_pass_rate", "lenient_ci_low" and "lenient_ci_high"."""
    out: dict[str, dict[str, Any]] = {}
    for name, values in sorted(rewards.items()):
        rate = sum(values) / len(values)
        low, high = wilson(rate, len(values))
        out[name] = {"pass_rate": rate, "instances": len(values), "ci_low": low, "ci_high": high}
        if lenient is not None:
            out[name] |= _lenient_rate(lenient[name])
    return out


def _lenient_rate(passes: list[float]) -> dict[str, float]:
    """{"lenient_pass_rate", "lenient_ci_low", "lenient_ci_high"} of these lenient passes."""
    rate = sum(passes) / len(passes) if passes else 0.0
    low, high = wilson(rate, len(passes))
    return {"lenient_pass_rate": rate, "lenient_ci_low": low, "lenient_ci_high": high}


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
