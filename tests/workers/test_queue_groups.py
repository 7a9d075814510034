"""Group records (GroupTracker) against the real Redis: completion is seen exactly once however
many members finish at once, the first result of a member wins, and a group past its deadline
completes with its missing members failed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared.groups import GroupTracker

pytestmark = pytest.mark.integration

FINISHERS = 8
MEMBERS = 40


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


def test_completion_is_reported_once_across_concurrent_finishers(client: Any) -> None:
    group = uuid.uuid4().hex
    members = [f"m{i}" for i in range(MEMBERS)]
    GroupTracker(client, "run").open(group, members, deadline_seconds=60)
    barrier = threading.Barrier(FINISHERS)
    completions: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def finisher(index: int) -> None:
        tracker = GroupTracker(redis.Redis(connection_pool=client.connection_pool), "run")
        try:
            barrier.wait()
            # Every member is finished by two finishers, in different orders.
            half = FINISHERS // 2
            mine = members[index % half :: half][:: -1 if index >= half else 1]
            for member in mine:
                if tracker.finish(group, member, {"ok": True, "by": index}):
                    completions.append((index, member))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=finisher, args=(i,)) for i in range(FINISHERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(completions) == 1, completions
    results = GroupTracker(client, "run").results(group)
    assert sorted(results) == sorted(members)
    assert all(r is not None and r["ok"] for r in results.values())
    # A late finisher changes nothing and does not complete the group again.
    tracker = GroupTracker(client, "run")
    before = results["m0"]
    assert tracker.finish(group, "m0", {"ok": False}) is False
    assert tracker.results(group)["m0"] == before
    assert tracker.expire(group, now=time.time() + 3600) is False


def test_expire_completes_a_group_past_its_deadline_with_failed_members(client: Any) -> None:
    tracker = GroupTracker(client, "run")
    group = uuid.uuid4().hex
    tracker.open(group, ["a", "b", "c"], deadline_seconds=30)
    tracker.open(group, ["x"], deadline_seconds=0)  # already open: unchanged
    assert tracker.finish(group, "a", {"ok": True, "reward": 1.0}) is False
    assert tracker.finish(group, "nobody", {"ok": True}) is False
    assert tracker.expire(group) is False, "the deadline has not passed"
    assert tracker.results(group) == {"a": {"ok": True, "reward": 1.0}, "b": None, "c": None}

    assert tracker.expire(group, now=time.time() + 31) is True
    results = tracker.results(group)
    assert results["a"] == {"ok": True, "reward": 1.0}
    for member in ("b", "c"):
        assert results[member] is not None and results[member]["ok"] is False
        assert "deadline" in results[member]["error"]
    # Completed once: expiring again, or the lost member turning up late, completes nothing.
    assert tracker.expire(group, now=time.time() + 3600) is False
    assert tracker.finish(group, "b", {"ok": True}) is False
    assert tracker.results(group)["b"]["ok"] is False
    assert client.ttl(f"evoenv:run:group:{group}") > 0, "the record expires in Redis"


def test_concurrent_expire_and_finish_complete_once(client: Any) -> None:
    for _ in range(20):
        group = uuid.uuid4().hex
        GroupTracker(client, "run").open(group, ["a", "b"], deadline_seconds=0)
        barrier = threading.Barrier(3)
        outcomes: list[bool] = []
        threads = [
            threading.Thread(target=_expire, args=(client, group, barrier, outcomes)),
            threading.Thread(target=_expire, args=(client, group, barrier, outcomes)),
            threading.Thread(target=_finish_all, args=(client, group, barrier, outcomes)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert outcomes.count(True) == 1, outcomes


def _expire(client: Any, group: str, barrier: threading.Barrier, outcomes: list[bool]) -> None:
    barrier.wait()
    outcomes.append(GroupTracker(client, "run").expire(group))


def _finish_all(client: Any, group: str, barrier: threading.Barrier, outcomes: list[bool]) -> None:
    barrier.wait()
    tracker = GroupTracker(client, "run")
    outcomes.append(tracker.finish(group, "a", {"ok": True}))
    outcomes.append(tracker.finish(group, "b", {"ok": True}))
