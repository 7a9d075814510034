"""The learner's loops (reading the rollout stream, sending and reaping jobs) wait for a lost
Redis (a restart, a connection Redis closed) instead of ending, and give up after
`outage.REDIS_OUTAGE` seconds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from evoenv_learner import outage
from evoenv_learner.loop import Learner
from evoenv_learner.orchestrator import Orchestrator


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
    monkeypatch.setattr(outage, "REDIS_RETRY", 0.01)
    learner, consumer = _learner(failures=3)
    asyncio.run(asyncio.wait_for(Learner.consume(learner), timeout=10))
    assert consumer.reads == 4 and learner.stop.is_set()


def test_a_redis_lost_longer_than_the_outage_ends_the_learner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outage, "REDIS_RETRY", 0.01)
    monkeypatch.setattr(outage, "REDIS_OUTAGE", 0.05)
    learner, consumer = _learner(failures=10_000)
    with pytest.raises(aioredis.ConnectionError):
        asyncio.run(asyncio.wait_for(Learner.consume(learner), timeout=10))
    assert 2 <= consumer.reads < 10_000


def test_sending_and_reaping_jobs_wait_for_a_lost_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outage, "REDIS_RETRY", 0.01)
    stop = asyncio.Event()
    rounds = []

    async def round_(synchronous: bool) -> None:
        rounds.append(synchronous)
        if len(rounds) <= 3:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379.")
        stop.set()

    async def pause(stop: asyncio.Event, seconds: float) -> None:
        return None

    learner = SimpleNamespace(synchronous=False, generator_groups_in_flight=1)
    orchestrator = SimpleNamespace(
        settings=SimpleNamespace(learner=learner), _round=round_, _pause=pause
    )
    asyncio.run(asyncio.wait_for(Orchestrator.run(orchestrator, stop), timeout=10))  # type: ignore[arg-type]
    assert len(rounds) == 4
