"""Sampling and grading in the sandbox: the `sample`, `grade` and `constant_baseline` jobs as
plain functions (a solver group's grading with its hidden probes and re-score), and the lenient
answers' rewards of an evaluation. Outcomes and rewards: docs/CONTRACT.md#grades.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

import structlog

from evoenv_worker.sandbox.host import OpResult, Sandbox
from shared.baseline import best_constant, candidates
from shared.config import Settings
from shared.environment import (
    ORACLE_KINDS,
    Grade,
    build_prompt,
    extract_answer,
    extract_lenient,
    grade_value,
)
from shared.messages import (
    REFERENCE_CHARS,
    ConstantBaseline,
    ConstantJob,
    GradedCompletion,
    GradedGroup,
    SolverGroupData,
    SolverJob,
)
from shared.static import declared_oracle

log = structlog.get_logger(__name__)

Answer = str | dict[str, str] | None
"""An answer of a `grade` op: a solver's extracted text, null (not scored), or a probe."""
DRAWS = random.SystemRandom()
"""Where probes go and which groups are scored again: from the operating system, so that
nothing an environment can compute says it."""

_INSTANCE_ROUTINES = frozenset({"sample", "solve", "render", "answer_text"})
"""Routines of a failed `grade` op that mean the instance itself could not be made."""


def grade_op(
    seed: int, difficulty: int, answers: Sequence[Answer], cap: int | None = None
) -> dict[str, Any]:
    """The sandbox op that samples and solves (seed, difficulty) once and scores `answers`
    (a null answer is not scored; a probe is filled in by the sandbox, with `cap` the answer
    cap its texts are extracted under)."""
    op = {"op": "grade", "seed": seed, "difficulty": difficulty, "answers": list(answers)}
    if cap is not None:
        op["cap"] = cap
    return op


def grade_op_seconds(settings: Settings, answers: int) -> float:
    """Time limit of one `grade` op of `answers` answers: the per-op limit for the instance
    and one per answer, capped at half a grade job's time limit (so a slow environment ends
    as an env_error, not as a killed job), but never below the per-op limit."""
    per_op = settings.sandbox.op_seconds
    cap = max(per_op, settings.worker.grade_time_limit / 2)
    return min(per_op * (1 + answers), cap)


def read_grades(result: OpResult, answers: Sequence[Answer]) -> tuple[list[Grade | None], str]:
    """The grade of each answer of a `grade` op (None for a null answer) and "", or no grades
    and the reason when the op failed or its reply does not have the expected shape.

    The reply holds each distinct reward once ("scores") and, per answer, the index of its
    reward or null ("outcomes"), with the errors of the answers whose scorer failed by position
    (see `sandbox/runner.py`). It is untrusted: every score is checked again, and an outcome
    that is not an index of "scores" is an answer without a reward."""
    if not result.ok:
        return [], result.reason
    value = result.value
    scores = value.get("scores") if isinstance(value, dict) else None
    outcomes = value.get("outcomes") if isinstance(value, dict) else None
    errors = value.get("errors") if isinstance(value, dict) else None
    if not (
        isinstance(scores, list)
        and isinstance(outcomes, list)
        and isinstance(errors, dict)
        and len(outcomes) == len(answers)
    ):
        return [], "the sandbox returned a malformed grade result"
    levels = [grade_value(score) for score in scores]  # grades are immutable: one per reward
    grades: list[Grade | None] = []
    for position, (answer, outcome) in enumerate(zip(answers, outcomes, strict=True)):
        if answer is None:
            grades.append(None)
        elif type(outcome) is int and 0 <= outcome < len(levels):
            grades.append(levels[outcome])
        else:
            error = errors.get(str(position))
            detail = error[:2000] if isinstance(error, str) else "the scorer gave no reward"
            grades.append(Grade.env_error(detail))
    return grades, ""


def sample_instance(sandbox: Sandbox, job: SolverJob) -> SolverJob:
    """The job with its prompt, or with `error` set when the environment failed to sample."""
    op = {"op": "instance", "seed": job.seed, "difficulty": job.difficulty}
    (result,) = sandbox.run(job.env.source, [op], filename=f"{job.env.name}.py")
    rendered = result.value.get("prompt") if isinstance(result.value, dict) else None
    if not result.ok or not isinstance(rendered, str):
        reason = result.reason if not result.ok else "the sandbox returned no prompt"
        log.warning("sample_failed", env=job.env.name, seed=job.seed, reason=reason)
        return job.model_copy(update={"error": f"sampling failed: {reason}"})
    prompt = build_prompt(rendered)
    if job.prompt_budget is not None and estimate_tokens(prompt) > job.prompt_budget:
        log.info("prompt_over_budget", env=job.env.name, difficulty=job.difficulty)
        return job.model_copy(update={"over_budget": True})
    return job.model_copy(update={"prompt": prompt})


def estimate_tokens(text: str) -> int:
    """A conservative token count without a tokenizer (about 3 characters a token)."""
    return len(text) // 3 + 1


def grade_group(
    sandbox: Sandbox, job: SolverJob, settings: Settings, draws: random.Random = DRAWS
) -> GradedGroup:
    """Score every completion of the job in one sandbox `grade` op.

    The instance is regenerated from its (seed, difficulty), sampled and solved once, and the
    reply is one line for the whole group (the op is in `sandbox/runner.py`). Every completion
    ends `scored`, `format_error` (reward 0) or `env_error` (no reward: left out of training and
    counted against the environment). A reply whose shape is wrong (the host checks it,
    `sandbox/results.py`, and `read_grades` again) makes the whole group an `env_error`, never
    an exception; infrastructure errors (`SandboxFailure`, Redis) propagate, and the task
    retries them.

    The op also carries hidden probes, and now and then one answer is scored again alone
    (`_graded`): where the scorer disagrees with itself, the group's data says so
    (`dishonest`) and the learner drops it. The completions, the prompt and the rewards are
    the same with probes as without.
    """
    if job.over_budget:  # nothing was sampled: the orchestrator serves it one level easier
        return _group(job, [], SolverGroupData(over_budget=True))
    cap = settings.validation.answer_cap
    extractions = [extract_answer(c.text, cap) for c in job.completions]
    answers = [e.answer for e in extractions]
    instance_error = job.error
    grades: list[Grade | None] = []
    dishonest = reference = None
    if not instance_error:
        grades, instance_error, dishonest, reference = _graded(
            sandbox, job, answers, settings, draws
        )
    graded: list[GradedCompletion] = []
    for k, (completion, extraction) in enumerate(zip(job.completions, extractions, strict=True)):
        base = completion.model_dump()
        if instance_error:
            grade = Grade.env_error(instance_error)
        elif extraction.answer is None:
            grade = Grade.format_error(extraction.problem)
        else:
            grade = grades[k] or Grade.env_error("no grade for this answer")
        graded.append(
            GradedCompletion(
                **base, reward=grade.reward, outcome=grade.outcome.value, detail=grade.detail
            )
        )
    data = SolverGroupData(
        env_error=instance_error or None, dishonest=dishonest, reference=reference
    )
    return _group(job, graded, data)


def _graded(
    sandbox: Sandbox,
    job: SolverJob,
    answers: list[str | None],
    settings: Settings,
    draws: random.Random,
) -> tuple[list[Grade | None], str | None, str | None, str | None]:
    """The grades of `answers`, scored in one `grade` op with the job's hidden probes among
    them (`probe_kinds`, `place_probes`); why the instance could not be made or graded (None:
    it was); what the grader saw if the scorer disagreed with itself (None: it did not, or
    nothing was checked): a probe scored wrong on this very instance (`probe_disagreement`),
    or, for a share `pool.rescore_rate` of the groups, one scored answer drawn at random got
    another reward scored again alone in a fresh process (`_rescored`); and the reference's
    answer text (None where the op gave none)."""
    asked, probes = place_probes(answers, probe_kinds(job, settings.pool.probe_rate, draws), draws)
    cap = settings.validation.answer_cap if probes else None
    (result,) = sandbox.run(
        job.env.source,
        [grade_op(job.seed, job.difficulty, asked, cap)],
        filename=f"{job.env.name}.py",
        op_seconds=grade_op_seconds(settings, sum(a is not None for a in asked)),
    )
    every, reason = read_grades(result, asked)
    if reason:
        step = "sampling" if result.routine in _INSTANCE_ROUTINES else "grading"
        return [], f"{step} failed: {reason}", None, None
    grades = [grade for position, grade in enumerate(every) if position not in probes]
    text = result.value.get("answer_text")  # untrusted: a string, cut
    reference = text[:REFERENCE_CHARS] if isinstance(text, str) else None
    dishonest = probe_disagreement(every, probes)
    if dishonest is None and draws.random() < settings.pool.rescore_rate:
        dishonest = _rescored(sandbox, job, answers, grades, settings, draws)
    if dishonest is not None:
        log.warning(
            "grading_disagreed",
            env=job.env.name,
            env_sha=job.env.sha,
            seed=job.seed,
            difficulty=job.difficulty,
            group=job.group_id,
            dishonest=dishonest,
        )
    return grades, None, dishonest, reference


def probe_kinds(job: SolverJob, rate: float, draws: random.Random) -> tuple[str, ...]:
    """The probes of the job's grading call, for a share `rate` of the calls: the reference's
    answer text (must score 1.0) and the empty answer (must not), and for an environment that
    declares an equality oracle a perturbed reference (must not either: a feasibility scorer
    may accept another answer)."""
    if draws.random() >= rate:
        return ()
    if _oracle(job.env.sha, job.env.source) == "equality":
        return ("reference", "empty", "perturbed")
    return ("reference", "empty")


@functools.lru_cache(maxsize=256)
def _oracle(sha: str, source: str) -> str:
    return declared_oracle(source.encode())


def place_probes(
    answers: Sequence[str | None], kinds: Sequence[str], draws: random.Random
) -> tuple[list[Answer], dict[int, str]]:
    """`answers` with a probe of each of `kinds` at random positions among them (the answers
    keep their order), and the probes' kinds by position."""
    total = len(answers) + len(kinds)
    order = list(kinds)
    draws.shuffle(order)
    probes = dict(zip(sorted(draws.sample(range(total), len(kinds))), order, strict=True))
    rest = iter(answers)
    asked: list[Answer] = [
        {"probe": probes[k]} if k in probes else next(rest) for k in range(total)
    ]
    return asked, probes


def probe_disagreement(grades: Sequence[Grade | None], probes: dict[int, str]) -> str | None:
    """What a probe saw if the scorer disagreed with itself on the instance (None: every
    probe scored as it must): the reference's answer text not scoring exactly 1.0, or the
    empty or the perturbed answer scoring 1.0. A probe the sandbox left without a text (the
    empty or perturbed one where it reads as the reference) has no reward and says nothing,
    except the reference's."""
    for position, kind in sorted(probes.items()):
        grade = grades[position]
        reward = grade.reward if grade is not None else None
        if kind == "reference" and reward != 1.0:
            got = f"{reward:g}" if reward is not None else "no reward"
            detail = f" ({grade.detail[:200]})" if grade is not None and grade.detail else ""
            return f"a hidden probe: the reference answer scored {got}{detail}, not 1.0"
        if kind != "reference" and reward is not None and reward >= 1.0:
            return f"a hidden probe: the {kind} answer scored {reward:g}"
    return None


def _rescored(
    sandbox: Sandbox,
    job: SolverJob,
    answers: list[str | None],
    grades: list[Grade | None],
    settings: Settings,
    draws: random.Random,
) -> str | None:
    """One scored answer, drawn at random, scored again alone in a `grade` op of its own (a
    fresh sandbox process): what was seen if its reward differs (None: the same, or nothing to
    score; a failed op says nothing, and is logged)."""
    scored = [k for k, grade in enumerate(grades) if grade is not None and grade.reward is not None]
    if not scored:
        return None
    k = draws.choice(scored)
    alone: list[Answer] = [answers[k]]
    (result,) = sandbox.run(
        job.env.source,
        [grade_op(job.seed, job.difficulty, alone)],
        filename=f"{job.env.name}.py",
        op_seconds=grade_op_seconds(settings, 1),
    )
    again, reason = read_grades(result, alone)
    if reason:
        log.warning("rescore_failed", env=job.env.name, seed=job.seed, reason=reason)
        return None
    before = grades[k]
    after = again[0].reward if again[0] is not None else None
    if before is None or after == before.reward:
        return None
    shown = f"{after:g}" if after is not None else "no reward"
    return (
        f"a re-score: answer {k} scored {before.reward:g} in the group's grading call and "
        f"{shown} alone in a fresh process"
    )


def lenient_rewards(
    sandbox: Sandbox, job: SolverJob, group: GradedGroup, settings: Settings
) -> list[float | None]:
    """Per completion of the graded `group`, the reward of its answer taken leniently
    (`extract_lenient`): a measurement, never a training reward. None where the strict grade is
    an `env_error`; the strict reward where there was a strict answer (the lenient one is the
    same); otherwise 0.0 where no answer can be taken, else the environment's score of it,
    given by a `grade` op of its own in the sandbox, as the strict answers are scored (0.0
    where the scorer fails on it or the op fails, as a constant's score counts it)."""
    cap = settings.validation.answer_cap
    rewards: list[float | None] = []
    asked: dict[int, str] = {}
    for k, completion in enumerate(group.completions):
        if completion.outcome != "format_error":
            rewards.append(completion.reward)
            continue
        rewards.append(0.0)
        answer = extract_lenient(completion.text, cap).answer
        if answer is not None:
            asked[k] = answer
    if not asked:
        return rewards
    answers: list[str | None] = list(asked.values())
    (result,) = sandbox.run(
        job.env.source,
        [grade_op(job.seed, job.difficulty, answers)],
        filename=f"{job.env.name}.py",
        op_seconds=grade_op_seconds(settings, len(answers)),
    )
    grades, reason = read_grades(result, answers)
    if reason:
        log.warning("lenient_grading_failed", env=job.env.name, seed=job.seed, reason=reason)
    for k, grade in zip(asked, grades, strict=False):  # no grades when the op failed
        rewards[k] = (grade.reward if grade else None) or 0.0
    return rewards


def _group(job: SolverJob, graded: list[GradedCompletion], data: SolverGroupData) -> GradedGroup:
    """The graded group of a job; its age is its oldest completion's policy version."""
    versions = [c.policy_version for c in job.completions]
    return GradedGroup(
        run=job.run,
        group_id=job.group_id,
        role="solver",
        env_name=job.env.name,
        env_sha=job.env.sha,
        seed=job.seed,
        difficulty=job.difficulty,
        prompt=job.prompt or "",
        policy_version=min(versions) if versions else 0,
        completions=graded,
        data=data,
    )


def constant_baseline(sandbox: Sandbox, job: ConstantJob, settings: Settings) -> ConstantBaseline:
    """The best constant answer on the job's instances (see `shared/baseline.py`), in two
    sandbox requests: the oracle and every instance's reference text (`grade` ops with no
    answer), then every candidate scored on every instance (one `grade` op per instance). A
    candidate whose scorer fails on an instance does not pass it."""
    filename = f"{job.env.name}.py"
    described, *made = sandbox.run(
        job.env.source,
        [{"op": "describe"}, *(grade_op(seed, job.difficulty, []) for seed in job.seeds)],
        filename=filename,
    )
    failed = next((r for r in (described, *made) if not r.ok), None)
    if failed is not None:
        return ConstantBaseline(error=f"{failed.routine or 'an op'} failed: {failed.reason}")
    oracle = described.value.get("oracle")
    if oracle not in ORACLE_KINDS:
        return ConstantBaseline(error=f"unknown oracle {oracle!r}")
    references = [str(r.value["answer_text"]).strip() for r in made]
    texts = candidates(oracle, references, job.answers)
    answers: list[str | None] = list(texts)
    scored = sandbox.run(
        job.env.source,
        [grade_op(seed, job.difficulty, answers) for seed in job.seeds],
        filename=filename,
        op_seconds=grade_op_seconds(settings, len(answers)),
    )
    rewards: list[list[float]] = []
    for result in scored:
        grades, reason = read_grades(result, answers)
        if reason:
            return ConstantBaseline(oracle=oracle, references=references, error=reason)
        rewards.append([(grade.reward or 0.0) if grade else 0.0 for grade in grades])
    best = best_constant(texts, rewards)
    if best is None:
        return ConstantBaseline(oracle=oracle, references=references, error="no instance")
    return ConstantBaseline(
        oracle=oracle,
        references=references,
        answer=best.answer,
        score=best.score,
        rewards=list(best.rewards),
    )
