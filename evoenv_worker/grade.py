"""Sampling and grading in the sandbox: the `sample` and `grade` jobs as plain functions.

`sample_instance` fills a solver job's prompt; `grade_group` regenerates the instance from its
(seed, difficulty), extracts each completion's answer and scores all of them in one sandbox
call. Every completion ends `scored`, `format_error` (reward 0) or `env_error` (no reward: left
out of training and counted against the environment).
"""

from __future__ import annotations

import structlog

from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.environment import Grade, build_prompt, extract_answer, grade_value
from shared.messages import GradedCompletion, GradedGroup, SolverJob

log = structlog.get_logger(__name__)


def sample_instance(sandbox: Sandbox, job: SolverJob) -> SolverJob:
    """The job with its prompt, or with `error` set when the environment failed to sample."""
    op = {"op": "instance", "seed": job.seed, "difficulty": job.difficulty}
    (result,) = sandbox.run(job.env.source, [op], filename=f"{job.env.name}.py")
    if not result.ok:
        log.warning("sample_failed", env=job.env.name, seed=job.seed, reason=result.reason)
        return job.model_copy(update={"error": f"sampling failed: {result.reason}"})
    return job.model_copy(update={"prompt": build_prompt(result.value["prompt"])})


def grade_group(sandbox: Sandbox, job: SolverJob, settings: Settings) -> GradedGroup:
    """Score every completion of the job in one sandbox call."""
    cap = settings.validation.answer_cap
    extractions = [extract_answer(c.text, cap) for c in job.completions]
    ops = [{"op": "instance", "seed": job.seed, "difficulty": job.difficulty}]
    ops += [
        {"op": "score", "from": 0, "answer": e.answer} for e in extractions if e.answer is not None
    ]
    results = [] if job.error else sandbox.run(job.env.source, ops, filename=f"{job.env.name}.py")
    instance_error = job.error or ("" if results[0].ok else f"sampling failed: {results[0].reason}")
    scores = iter(results[1:])
    graded: list[GradedCompletion] = []
    for completion, extraction in zip(job.completions, extractions, strict=True):
        base = completion.model_dump()
        if instance_error:
            graded.append(
                GradedCompletion(**base, reward=None, outcome="env_error", detail=instance_error)
            )
        elif extraction.answer is None:
            graded.append(
                GradedCompletion(
                    **base, reward=0.0, outcome="format_error", detail=extraction.problem
                )
            )
        else:
            result = next(scores)
            grade = grade_value(result.value) if result.ok else Grade.env_error(result.reason)
            graded.append(
                GradedCompletion(
                    **base, reward=grade.reward, outcome=grade.outcome.value, detail=grade.detail
                )
            )
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
        data={"env_error": instance_error} if instance_error else {},
    )
