"""The learner's reading of the rollout stream waits for a lost Redis (a restart, a connection
Redis closed) instead of ending, and gives up after `REDIS_OUTAGE` seconds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis

from evoenv_learner import loop
from evoenv_learner.loop import Learner


class Flaky:
    """A consumer whose reads fail `failures` times as a lost Redis does, then stop the loop."""

    def __init__(self, failures: int, stop: asyncio.Event) -> None:
        self.failures, self.stop, self.reads = failures, stop, 0
        self.stats = SimpleNamespace(stale=0)

    async def read(self, count: int, block_ms: int, version: int) -> list[Any]:
        self.reads += 1
        if self.reads <= self.failures:
            raise aioredis.ConnectionError("Connection closed by server.")
        self.stop.set()
        return []

    def take_dropped(self) -> list[Any]:
        return []


def _learner(failures: int) -> tuple[Any, Flaky]:
    stop = asyncio.Event()
    consumer = Flaky(failures, stop)
    settings = SimpleNamespace(grpo=SimpleNamespace(batch_groups=1))
    state = SimpleNamespace(version=0, stale_at_step=0, stale_dropped=0, funnel={})
    return SimpleNamespace(
        state=state, consumer=consumer, settings=settings, stop=stop, orchestrator=None
    ), consumer


def test_a_lost_redis_is_waited_for_and_reading_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "REDIS_RETRY", 0.01)
    learner, consumer = _learner(failures=3)
    asyncio.run(asyncio.wait_for(Learner.consume(learner), timeout=10))
    assert consumer.reads == 4 and learner.stop.is_set()


def test_a_redis_lost_longer_than_the_outage_ends_the_learner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loop, "REDIS_RETRY", 0.01)
    monkeypatch.setattr(loop, "REDIS_OUTAGE", 0.05)
    learner, consumer = _learner(failures=10_000)
    with pytest.raises(aioredis.ConnectionError):
        asyncio.run(asyncio.wait_for(Learner.consume(learner), timeout=10))
    assert 2 <= consumer.reads < 10_000
