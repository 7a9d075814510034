"""The only `Celery()` of EvoEnv, configured from settings by `configure`.

Delivery is at least once (docs/DESIGN.md#failure-rules): late acknowledgement, a job whose
worker process dies is handed back, prefetch of one, a Redis visibility timeout longer than
every hard time limit, and JSON only. Jobs are routed by the resource they need: `generation`
(vLLM, I/O), `validation` and `grading` (sandbox CPU).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from celery import Celery, signals
from kombu import Queue

from evoenv_worker import broker
from shared import keys
from shared.config import Settings
from shared.logging import configure_logging

broker.install()  # queue entries that are not messages are dropped, not fatal
app = Celery("evoenv", set_as_current=True)
app.conf.update(worker_hijack_root_logger=False)

ROUTES = {
    "evoenv.validate": keys.VALIDATION_QUEUE,
    "evoenv.sample": keys.GRADING_QUEUE,
    "evoenv.grade": keys.GRADING_QUEUE,
    "evoenv.constant_baseline": keys.GRADING_QUEUE,
    "evoenv.complete": keys.GENERATION_QUEUE,
    "evoenv.propose": keys.GENERATION_QUEUE,
    "evoenv.review": keys.GENERATION_QUEUE,
    "evoenv.calibrate_sample": keys.GRADING_QUEUE,
    "evoenv.calibrate_complete": keys.GENERATION_QUEUE,
    "evoenv.calibrate_grade": keys.GRADING_QUEUE,
    "evoenv.novelty": keys.VALIDATION_QUEUE,
}


def configure(settings: Settings) -> Celery:
    """Point the app at the configured Redis and apply the delivery rules; returns the app."""
    from evoenv_worker import context

    w = settings.worker
    limits = {
        "evoenv.validate": w.validate_time_limit,
        "evoenv.novelty": w.validate_time_limit,
        "evoenv.sample": w.grade_time_limit,
        "evoenv.grade": w.grade_time_limit,
        # every instance of an evaluation made twice, then up to MAX_CANDIDATES answers scored
        "evoenv.constant_baseline": w.validate_time_limit,
        "evoenv.calibrate_sample": w.grade_time_limit,
        "evoenv.calibrate_grade": w.grade_time_limit,
        "evoenv.complete": w.complete_time_limit,
        "evoenv.propose": w.complete_time_limit,
        "evoenv.review": w.complete_time_limit,
        "evoenv.calibrate_complete": w.complete_time_limit,
    }
    redis_options = {
        "visibility_timeout": int(w.visibility_timeout),
        # Sweep for jobs of dead workers often (kombu's default is every ~100 s), so a job
        # whose visibility timeout ran out is handed out again soon after.
        "unacked_restore_interval": max(1, min(10, int(w.visibility_timeout // 10))),
        "unacked_restore_throttle": 1,
        "socket_connect_timeout": w.connect_timeout,
        "socket_keepalive": True,
        "retry_on_timeout": True,
    }
    app.conf.update(
        broker_url=settings.redis_url,
        result_backend=settings.redis_url,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_queues=[Queue(name) for name in keys.QUEUES],
        task_default_queue=keys.VALIDATION_QUEUE,
        task_routes={name: {"queue": queue} for name, queue in ROUTES.items()},
        task_annotations={
            name: {
                "time_limit": limit,
                "soft_time_limit": limit * 0.9,
                "max_retries": w.max_retries,
            }
            for name, limit in limits.items()
        },
        broker_transport_options=redis_options,
        result_backend_transport_options={"retry_policy": {"timeout": w.connect_timeout}},
        redis_socket_connect_timeout=w.connect_timeout,
        redis_socket_timeout=max(w.connect_timeout, 30.0),
        broker_connection_timeout=w.connect_timeout,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        result_expires=7 * 24 * 3600,
        result_extended=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_soft_shutdown_timeout=10.0,
        worker_enable_soft_shutdown_on_idle=True,
    )
    context.install(settings)
    return app


@signals.setup_logging.connect
def _setup_logging(**_: Any) -> None:
    from evoenv_worker import context

    settings = context.settings()
    configure_logging(settings.log_format, settings.log_level)


@signals.task_prerun.connect
def _bind_task(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(task_id=task_id, task=getattr(task, "name", None))


@signals.task_postrun.connect
def _unbind_task(**_: Any) -> None:
    structlog.contextvars.clear_contextvars()


@signals.worker_process_init.connect
def _fresh_process(**_: Any) -> None:
    from evoenv_worker import context

    context.after_fork()
    logging.getLogger(__name__).debug("worker process ready")


@signals.worker_process_shutdown.connect
def _close_process(**_: Any) -> None:
    from evoenv_worker import context

    context.close()


import evoenv_worker.tasks  # noqa: E402,F401 - registers the tasks on the app
