"""The learner's Celery client: it sends jobs to the workers by task name, without their code.

Importing this module connects to nothing and changes no global Celery state (its app is not
the current one). This module and the workers' app are the only two that configure Celery.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from celery import Celery, chain
from celery.canvas import Signature
from celery.result import AsyncResult
from kombu import Queue
from kombu.exceptions import OperationalError

from shared import keys, routes
from shared.config import Settings

BROKER_LOST = (OperationalError,)
"""What sending a job raises when the broker (Redis) cannot be reached."""

app = Celery("evoenv-learner", set_as_current=False)
_limits: dict[str, float] | None = None
"""Task name -> hard time limit, once configured."""
_lock = threading.Lock()


def configure(settings: Settings) -> Celery:
    """Point the client at the configured Redis (again, if called again); returns its app.

    The learner's entry points call it; otherwise the app is configured on first use from the
    environment (`Settings()`). The broker, result backend and connection settings are the
    workers' own (`shared.routes.common_conf`).
    """
    global _limits
    with _lock:
        app.conf.update(
            **routes.common_conf(settings), task_queues=[Queue(name) for name in keys.QUEUES]
        )
        _limits = routes.time_limits(settings)
    return app


def _limits_now() -> dict[str, float]:
    """The time limits of the configured client (configured from the environment's settings
    if nothing was)."""
    if _limits is None:
        configure(Settings())
    assert _limits is not None
    return _limits


def client() -> Celery:
    """The configured app (configured from the environment's settings if nothing was)."""
    _limits_now()
    return app


def _options(name: str) -> dict[str, Any]:
    """What the workers' app adds to a job of task `name` that it sends: its queue, its time
    limits (the workers' `task_annotations`) and its task's defaults."""
    limit = _limits_now()[name]
    return {
        "queue": routes.ROUTES[name],
        "time_limit": limit,
        "soft_time_limit": limit * routes.SOFT_LIMIT_SHARE,
        "serializer": app.conf.task_serializer,
        "ignore_result": False,
    }


def send(name: str, *args: Any, **options: Any) -> AsyncResult:
    """Send one job of task `name` with positional `args`; its AsyncResult. `options` are
    Celery's sending options (task_id, countdown, ...).

    The job goes as the workers' own app would send it: JSON to the queue of
    `shared.routes.ROUTES`, with the time limits of `shared.routes.time_limits`.
    """
    return client().send_task(name, args=list(args), **(_options(name) | options))


def send_chain(names: Sequence[str], *args: Any) -> AsyncResult:
    """Send a chain of the tasks `names`, the first given `args`, each next one the result of
    the one before; the AsyncResult of the last. Only the first job is sent from here: the
    workers send each next one (queued and timed by their own app, as always)."""
    first, *rest = names
    steps: list[Signature] = [client().signature(first, args=list(args), **_options(first))]
    steps += [client().signature(name) for name in rest]
    return chain(*steps).apply_async()
