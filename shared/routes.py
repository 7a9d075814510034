"""How jobs travel between the learner and the workers, in one place for both ends: each task's
queue (`ROUTES`, by the resource it needs) and time limits, and the Celery settings that the
workers' Celery app and the learner's client share. Plain values only: nothing in shared/
imports Celery. Delivery rules: docs/DESIGN.md#failure-rules.
"""

from __future__ import annotations

from typing import Any

from shared import keys
from shared.config import Settings

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
"""Task name -> the queue its jobs go to."""

SOFT_LIMIT_SHARE = 0.9
"""A task's soft time limit, as a share of its hard one."""


def time_limits(settings: Settings) -> dict[str, float]:
    """Task name -> its hard time limit in seconds (`worker.*_time_limit`; the generation
    queue's: `worker.complete_wall_limit`, since the seconds its requests spend frozen by a
    pause of the servers do not count against `complete_time_limit`)."""
    w = settings.worker
    return {
        "evoenv.validate": w.validate_time_limit,
        "evoenv.novelty": w.validate_time_limit,
        "evoenv.sample": w.grade_time_limit,
        "evoenv.grade": w.grade_time_limit,
        # every instance of an evaluation made twice, then up to MAX_CANDIDATES answers scored
        "evoenv.constant_baseline": w.validate_time_limit,
        "evoenv.calibrate_sample": w.grade_time_limit,
        "evoenv.calibrate_grade": w.grade_time_limit,
        "evoenv.complete": w.complete_wall_limit,
        "evoenv.propose": w.complete_wall_limit,
        "evoenv.review": w.complete_wall_limit,
        "evoenv.calibrate_complete": w.complete_wall_limit,
    }


def common_conf(settings: Settings) -> dict[str, Any]:
    """The Celery settings of both ends: the broker and result backend (the configured Redis),
    JSON only, the routes, connection timeouts and retries, the Redis transport's options,
    sent events, and how long results are kept. The queues are `keys.QUEUES`: each end makes
    its own kombu `Queue`s of them (`task_queues`)."""
    w = settings.worker
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
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.redis_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": keys.VALIDATION_QUEUE,
        "task_routes": {name: {"queue": queue} for name, queue in ROUTES.items()},
        "broker_transport_options": redis_options,
        "result_backend_transport_options": {"retry_policy": {"timeout": w.connect_timeout}},
        "redis_socket_connect_timeout": w.connect_timeout,
        "redis_socket_timeout": max(w.connect_timeout, 30.0),
        "broker_connection_timeout": w.connect_timeout,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "task_send_sent_event": True,
        "result_expires": 7 * 24 * 3600,
        "result_extended": True,
    }
