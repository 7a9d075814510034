"""Sampling and grading in the sandbox: the `sample`, `grade` and `constant_baseline` jobs as
plain functions, and the lenient answers' rewards of an evaluation. Outcomes and rewards:
docs/CONTRACT.md#grades.
"""

from __future__ import annotations

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
    ConstantBaseline,
    ConstantJob,
    GradedCompletion,
    GradedGroup,
    SolverGroupData,
    SolverJob,
)

log = structlog.get_logger(__name__)

_INSTANCE_ROUTINES = frozenset({"sample", "solve", "render", "answer_text"})
"""Routines of a failed `grade` op that mean the instance itself could not be made."""


def grade_op(seed: int, difficulty: int, answers: list[str | None]) -> dict[str, Any]:
    """The sandbox op that samples and solves (seed, difficulty) once and scores `answers`
    (a null answer is not scored)."""
    return {"op": "grade", "seed": seed, "difficulty": difficulty, "answers": answers}


def grade_op_seconds(settings: Settings, answers: int) -> float:
    """Time limit of one `grade` op of `answers` answers: the per-op limit for the instance
    and one per answer, capped at half a grade job's time limit (so a slow environment ends
    as an env_error, not as a killed job), but never below the per-op limit."""
    per_op = settings.sandbox.op_seconds
    cap = max(per_op, settings.worker.grade_time_limit / 2)
    return min(per_op * (1 + answers), cap)


def read_grades(result: OpResult, answers: list[str | None]) -> tuple[list[Grade | None], str]:
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


def grade_group(sandbox: Sandbox, job: SolverJob, settings: Settings) -> GradedGroup:
    """Score every completion of the job in one sandbox `grade` op.

    The instance is regenerated from its (seed, difficulty), sampled and solved once, and the
    reply is one line for the whole group (the op is in `sandbox/runner.py`). Every completion
    ends `scored`, `format_error` (reward 0) or `env_error` (no reward: left out of training and
    counted against the environment). A reply whose shape is wrong (the host checks it,
    `sandbox/results.py`, and `read_grades` again) makes the whole group an `env_error`, never
    an exception; infrastructure errors (`SandboxFailure`, Redis) propagate, and the task
    retries them.
    """
    if job.over_budget:  # nothing was sampled: the orchestrator serves it one level easier
        return _group(job, [], SolverGroupData(over_budget=True))
    cap = settings.validation.answer_cap
    extractions = [extract_answer(c.text, cap) for c in job.completions]
    answers = [e.answer for e in extractions]
    instance_error = job.error
    grades: list[Grade | None] = []
    if not instance_error:
        (result,) = sandbox.run(
            job.env.source,
            [grade_op(job.seed, job.difficulty, answers)],
            filename=f"{job.env.name}.py",
            op_seconds=grade_op_seconds(settings, sum(a is not None for a in answers)),
        )
        grades, reason = read_grades(result, answers)
        if reason:
            step = "sampling" if result.routine in _INSTANCE_ROUTINES else "grading"
            instance_error = f"{step} failed: {reason}"
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
    return _group(job, graded, SolverGroupData(env_error=instance_error or None))


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
