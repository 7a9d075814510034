"""The workers' `Celery()`, configured from settings by `configure`.

Delivery is at least once (docs/DESIGN.md#failure-rules). Routes, time limits and connection
settings come from `shared.routes`, which the learner's client (the only other `Celery()`)
sends with.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from celery import Celery, signals
from kombu import Queue

from evoenv_worker import broker, watchdog
from shared import keys, routes
from shared.config import Settings
from shared.logging import configure_logging

broker.install()  # queue entries that are not messages are dropped, not fatal
app = Celery("evoenv", set_as_current=True)
app.conf.update(worker_hijack_root_logger=False)


def configure(settings: Settings) -> Celery:
    """Point the app at the configured Redis and apply the delivery rules; returns the app.

    What the learner's client shares with it, routes and time limits among them, comes from
    `shared.routes`; the rest is the workers' own."""
    from evoenv_worker import context

    w = settings.worker
    app.conf.update(
        **routes.common_conf(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_max_tasks_per_child=w.max_tasks_per_child or None,
        task_queues=[Queue(name) for name in keys.QUEUES],
        task_annotations={
            name: {
                "time_limit": limit,
                "soft_time_limit": limit * routes.SOFT_LIMIT_SHARE,
                "max_retries": w.max_retries,
            }
            for name, limit in routes.time_limits(settings).items()
        },
        worker_send_task_events=True,
        task_track_started=True,
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


@signals.worker_shutting_down.connect
def _stopping(**_: Any) -> None:
    watchdog.stopping()  # a broker gone from now on ends the worker at once


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
