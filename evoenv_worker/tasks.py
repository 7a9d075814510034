"""Thin Celery tasks: decode the message, call a plain function, encode the result.

Every task shares `JobTask`'s delivery rules (docs/DESIGN.md#failure-rules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import redis
import structlog
from celery import Task, chain
from celery.exceptions import Reject
from pydantic import BaseModel, ValidationError

from evoenv_worker import context
from evoenv_worker.app import app
from shared import keys
from shared.errors import EvoEnvError, SandboxFailure, SandboxUnavailable, ServiceUnavailable
from shared.messages import (
    ConstantJob,
    DeadLetter,
    ProposalJob,
    SolverJob,
    StageJob,
    ValidateJob,
)

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.verdict import CompletedGroup

log = structlog.get_logger(__name__)
M = TypeVar("M", bound=BaseModel)

INFRASTRUCTURE_ERRORS = (
    ServiceUnavailable,
    SandboxFailure,
    SandboxUnavailable,
    redis.ConnectionError,
    redis.TimeoutError,
    ConnectionError,
    TimeoutError,
)


class JobTask(Task):  # type: ignore[misc]
    """The delivery rules every task shares.

    Infrastructure errors (Redis, the sandbox, a model server) are retried with bounded
    exponential backoff; a job delivered more than `worker.max_deliveries` times (redeliveries
    after a lost worker and retries together) or failing past its retries lands in the dead
    letters with its last error instead of looping; a message that does not decode is rejected
    with its reason, never retried, and never kills the worker.
    """

    autoretry_for = INFRASTRUCTURE_ERRORS
    retry_backoff = 2
    retry_backoff_max = 60
    retry_jitter = True
    max_retries = 5
    acks_late = True
    reject_on_worker_lost = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task_id = self.request.id
        if task_id and not self.request.is_eager:
            ctx = context.current()
            client = ctx.redis()
            attempts = int(client.incr(keys.attempts(task_id)))
            client.expire(keys.attempts(task_id), 7 * 24 * 3600)
            if attempts > ctx.settings.worker.max_deliveries:
                last = client.hget(keys.LAST_ERRORS, task_id)
                reason = (
                    last.decode() if last else "redelivered too often (the worker died each time?)"
                )
                # Fail the job, so that its result says why; on_failure gives it up.
                raise EvoEnvError(f"dead-lettered after {attempts} deliveries: {reason}")
        return super().__call__(*args, **kwargs)

    def decode(self, model: type[M], payload: Any) -> M:
        """The task's message as `model`; a malformed one is rejected with its reason."""
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            reason = (
                f"malformed {model.__name__}: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
            )
            log.error("bad_message", reason=reason)
            self._dead_letter(self.request.id or "?", 1, reason, (payload,))
            raise Reject(reason, requeue=False) from exc

    def on_retry(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        log.warning("job_retry", error=str(exc), retries=self.request.retries)
        context.current().redis().hset(keys.LAST_ERRORS, task_id, str(exc)[:2000])

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        if isinstance(exc, Reject):
            return
        attempts = int(context.current().redis().get(keys.attempts(task_id)) or 1)
        self._give_up(task_id, attempts, f"{type(exc).__name__}: {exc}", args)

    def _give_up(self, task_id: str, attempts: int, error: str, args: Any) -> None:
        """A job that will not run again: dead letter, and tell the admission flow (so its
        candidate and group still complete)."""
        self._dead_letter(task_id, attempts, error, args)
        if args and isinstance(args[0], dict):
            from evoenv_worker.verdict import job_failed

            ctx = context.current()
            finalize_completed(ctx, job_failed(ctx, self.name, args[0], error))

    def _dead_letter(self, task_id: str, attempts: int, error: str, args: Any) -> None:
        payload = args[0] if args and isinstance(args[0], dict) else {"args": repr(args)[:2000]}
        letter = DeadLetter(
            task_id=task_id, task=self.name, attempts=attempts, error=error[:2000], payload=payload
        )
        context.current().redis().hset(keys.DEAD_LETTERS, task_id, letter.model_dump_json())
        log.error("job_dead_lettered", task_id=task_id, attempts=attempts, error=error[:500])


@app.task(name="evoenv.validate", base=JobTask, bind=True)
def validate(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Validate one environment file: L1-L5 here, then (if asked) the model stages as jobs on
    their own queues. The full report is stored under the job id when the last stage ends."""
    from evoenv_worker.mechanical import validate_job
    from evoenv_worker.verdict import after_mechanical

    job = self.decode(ValidateJob, payload)
    ctx = context.current()
    report = validate_job(ctx, job)
    after = after_mechanical(ctx, job, report)
    if isinstance(after, StageJob):
        send_model_stages(after)
    else:
        finalize_completed(ctx, after.completed)
    return report.model_dump(mode="json")


def finalize_completed(ctx: WorkerContext, group: CompletedGroup | None) -> None:
    """Finalise the generation group that a job's candidate completed (admission says which;
    `generation.finalize_group` does it): every path that concludes a candidate ends here."""
    if group is not None:
        from evoenv_worker.generation_groups import finalize_group

        finalize_group(ctx, group.run, group.group_id)


def send_model_stages(job: StageJob) -> None:
    """Review on `generation`; calibration as sample -> complete -> grade; novelty on `validation`."""
    payload = job.model_dump(mode="json")
    review.apply_async(args=[payload])
    send_calibration(job)
    novelty.apply_async(args=[payload])


def send_calibration(job: StageJob) -> None:
    """One calibration of a candidate: sample (grading) -> complete (generation) -> grade."""
    payload = job.model_dump(mode="json")
    chain(calibrate_sample.s(payload), calibrate_complete.s(), calibrate_grade.s()).apply_async()


@app.task(name="evoenv.sample", base=JobTask, bind=True)
def sample(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Fill a solver job's prompt from its (environment, seed, difficulty), in the sandbox."""
    from evoenv_worker.grade import sample_instance

    job = self.decode(SolverJob, payload)
    return sample_instance(context.current().sandbox(), job).model_dump(mode="json")


@app.task(name="evoenv.grade", base=JobTask, bind=True)
def grade(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Grade a solver job's completions in one sandbox call; append the group to the stream.
    Returns each completion's reward and extracted answer text (None: no answer span); for a
    `lenient` job also each one's lenient answer and its reward (`grade.lenient_rewards`)."""
    from evoenv_worker.grade import grade_group, lenient_rewards
    from shared.environment import extract_answer, extract_lenient
    from shared.rollouts import append_group

    job = self.decode(SolverJob, payload)
    ctx = context.current()
    group = grade_group(ctx.sandbox(), job, ctx.settings)
    entry = append_group(ctx.redis(), group, ctx.stream_key())
    log.info(
        "group_graded",
        group_id=group.group_id,
        env=group.env_name,
        entry=entry,
        rewards=[c.reward for c in group.completions],
    )
    cap = ctx.settings.validation.answer_cap
    result = {
        "group_id": group.group_id,
        "entry": entry,
        "duplicate": entry is None,
        "rewards": [c.reward for c in group.completions],
        "answers": [extract_answer(c.text, cap).answer for c in group.completions],
    }
    if job.lenient:
        result["lenient_rewards"] = lenient_rewards(ctx.sandbox(), job, group, ctx.settings)
        result["lenient_answers"] = [extract_lenient(c.text, cap).answer for c in group.completions]
    return result


@app.task(name="evoenv.constant_baseline", base=JobTask, bind=True)
def constant_baseline(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """The best constant answer of an environment on given instances, in the sandbox."""
    from evoenv_worker.grade import constant_baseline as find_baseline

    job = self.decode(ConstantJob, payload)
    ctx = context.current()
    return find_baseline(ctx.sandbox(), job, ctx.settings).model_dump(mode="json")


@app.task(name="evoenv.complete", base=JobTask, bind=True)
def complete(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Sample a solver job's completions from vLLM (generation queue, many in flight)."""
    from evoenv_worker.solver_completions import complete_solver

    job = self.decode(SolverJob, payload)
    return complete_solver(context.current().inference(), job).model_dump(mode="json")


@app.task(name="evoenv.propose", base=JobTask, bind=True)
def propose(self: JobTask, payload: dict[str, Any]) -> list[str]:
    """Sample a generation group's candidates and send each to validation (model stages on)."""
    from evoenv_worker.generation_groups import propose as propose_candidates

    job = self.decode(ProposalJob, payload)
    jobs = propose_candidates(context.current(), job)
    for candidate in jobs:
        validate.apply_async(args=[candidate.model_dump(mode="json")], task_id=candidate.job_id)
    return [candidate.job_id for candidate in jobs]


@app.task(name="evoenv.review", base=JobTask, bind=True)
def review(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """K semantic self-reviews of a candidate, and its second solves where they are on
    (generation queue; the written solves run in this worker's sandbox)."""
    from evoenv_worker.model_stages import review_stage
    from evoenv_worker.verdict import finish_stage

    job = self.decode(StageJob, payload)
    ctx = context.current()
    sandbox = ctx.sandbox() if ctx.settings.admission.second_solves else None
    report = review_stage(ctx.reviewer(), job, ctx.settings, sandbox)
    finalize_completed(ctx, finish_stage(ctx, job, report))
    return report.model_dump(mode="json")


@app.task(name="evoenv.calibrate_sample", base=JobTask, bind=True)
def calibrate_sample(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Calibration, step 1: the m instances' prompts, in the sandbox (grading queue)."""
    from evoenv_worker.model_stages import calibration_sample

    job = self.decode(StageJob, payload)
    return calibration_sample(context.current().sandbox(), job).model_dump(mode="json")


@app.task(name="evoenv.calibrate_complete", base=JobTask, bind=True)
def calibrate_complete(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Calibration, step 2: one solver answer per instance (generation queue)."""
    from evoenv_worker.model_stages import calibration_complete

    job = self.decode(StageJob, payload)
    ctx = context.current()
    return calibration_complete(ctx.inference(), job, ctx.settings).model_dump(mode="json")


@app.task(name="evoenv.calibrate_grade", base=JobTask, bind=True)
def calibrate_grade(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Calibration, step 3: grade the answers; the pass rate decides, or sends the calibration
    search's next level through the same three steps (grading queue)."""
    from evoenv_worker.model_stages import calibration_next, calibration_stage
    from evoenv_worker.verdict import finish_stage

    job = self.decode(StageJob, payload)
    ctx = context.current()
    found = calibration_stage(ctx.sandbox(), job, ctx.settings)
    following, report = calibration_next(job, found, ctx.settings)
    if following is not None:
        send_calibration(following)
        return found.model_dump(mode="json")
    finalize_completed(ctx, finish_stage(ctx, job, report))
    return report.model_dump(mode="json")


@app.task(name="evoenv.novelty", base=JobTask, bind=True)
def novelty(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Embeddings and similarity to the pool (validation queue: CPU)."""
    from evoenv_worker.model_stages import novelty_stage
    from evoenv_worker.verdict import finish_stage

    job = self.decode(StageJob, payload)
    ctx = context.current()
    report = novelty_stage(ctx, job)
    finalize_completed(ctx, finish_stage(ctx, job, report))
    return report.model_dump(mode="json")
