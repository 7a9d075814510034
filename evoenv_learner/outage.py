"""Redis lost for a while (restarted, a connection it closed): the learner's loops wait for it,
up to `REDIS_OUTAGE` seconds, rather than end (a restarted learner rolls back to its checkpoint)."""

from __future__ import annotations

import asyncio
import time

import redis
import structlog

from evoenv_learner.jobs import BROKER_LOST

log = structlog.get_logger(__name__)

REDIS_OUTAGE = 300.0
"""Seconds a loop waits for a lost Redis before the error ends the learner (`up` restarts it)."""
REDIS_RETRY = 2.0
"""Seconds between tries while Redis is lost."""
LOST = (redis.ConnectionError, redis.TimeoutError, *BROKER_LOST)
"""What a lost Redis raises: redis-py's errors (sync and asyncio share them), Celery's sends."""


class Outage:
    """One loop's view of a lost Redis: `failed` after an error (waits, or re-raises once it has
    lasted `REDIS_OUTAGE`), `ok` after a pass that reached Redis."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.since: float | None = None

    async def failed(self, exc: BaseException) -> None:
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since > REDIS_OUTAGE:
            raise exc
        log.warning("redis_unreachable", where=self.where, error=str(exc)[:200])
        await asyncio.sleep(REDIS_RETRY)

    def ok(self) -> None:
        if self.since is not None:
            log.info("redis_back", where=self.where, after=round(time.monotonic() - self.since, 1))
            self.since = None
