"""Thin Celery tasks: decode the message, call a plain function, encode the result.

Every task shares `JobTask`'s delivery rules: infrastructure errors (Redis, the sandbox, a model
server) are retried with bounded exponential backoff; a job delivered more than
`worker.max_deliveries` times (redeliveries after a lost worker and retries together) or failing
past its retries lands in the dead letters with its last error instead of looping; a message
that does not decode is rejected with its reason, never retried, and never kills the worker.
"""

from __future__ import annotations

from typing import Any, TypeVar

import redis
import structlog
from celery import Task
from celery.exceptions import Reject
from pydantic import BaseModel, ValidationError

from evoenv_worker import context
from evoenv_worker.app import app
from shared import keys
from shared.errors import SandboxFailure, SandboxUnavailable, ServiceUnavailable
from shared.messages import DeadLetter, SolverJob, ValidateJob

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
                self._dead_letter(task_id, attempts, reason, args)
                return None
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
        self._dead_letter(task_id, attempts, f"{type(exc).__name__}: {exc}", args)

    def _dead_letter(self, task_id: str, attempts: int, error: str, args: Any) -> None:
        payload = args[0] if args and isinstance(args[0], dict) else {"args": repr(args)[:2000]}
        letter = DeadLetter(
            task_id=task_id, task=self.name, attempts=attempts, error=error[:2000], payload=payload
        )
        context.current().redis().hset(keys.DEAD_LETTERS, task_id, letter.model_dump_json())
        log.error("job_dead_lettered", task_id=task_id, attempts=attempts, error=error[:500])


@app.task(name="evoenv.validate", base=JobTask, bind=True)
def validate(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Validate one environment file (L1-L5); the report is stored under the job id."""
    from evoenv_worker.validate import validate_job

    job = self.decode(ValidateJob, payload)
    return validate_job(context.current(), job).model_dump(mode="json")


@app.task(name="evoenv.sample", base=JobTask, bind=True)
def sample(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Fill a solver job's prompt from its (environment, seed, difficulty), in the sandbox."""
    from evoenv_worker.grade import sample_instance

    job = self.decode(SolverJob, payload)
    return sample_instance(context.current().sandbox(), job).model_dump(mode="json")


@app.task(name="evoenv.grade", base=JobTask, bind=True)
def grade(self: JobTask, payload: dict[str, Any]) -> dict[str, Any]:
    """Grade a solver job's completions in one sandbox call; append the group to the stream."""
    from evoenv_worker.grade import grade_group
    from shared.rollouts import append_group

    job = self.decode(SolverJob, payload)
    ctx = context.current()
    group = grade_group(ctx.sandbox(), job, ctx.settings)
    entry = append_group(ctx.redis(), group)
    log.info(
        "group_graded",
        group_id=group.group_id,
        env=group.env_name,
        entry=entry,
        rewards=[c.reward for c in group.completions],
    )
    return {
        "group_id": group.group_id,
        "entry": entry,
        "duplicate": entry is None,
        "rewards": [c.reward for c in group.completions],
    }
