"""Group records (GroupTracker) against the real Redis: completion is seen exactly once however
many members finish at once, the first result of a member wins, and a group closed by `expire`
(its sender's deadline passed) never completes afterwards, nor opens again."""

from __future__ import annotations

import threading
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
    GroupTracker(client, "run").open(group, members)
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
    assert tracker.expire(group) is False, "completed: nothing to expire"


def test_an_expired_group_never_completes_and_a_late_open_leaves_it_closed(client: Any) -> None:
    tracker = GroupTracker(client, "run")
    group = uuid.uuid4().hex
    tracker.open(group, ["a", "b"])
    tracker.open(group, ["x"])  # already open: unchanged
    assert tracker.finish(group, "a", {"ok": True, "reward": 1.0}) is False
    assert tracker.finish(group, "nobody", {"ok": True}) is False

    assert tracker.expire(group) is True
    assert tracker.expire(group) is False, "closed once"
    # The lost member turning up late is recorded but completes nothing.
    assert tracker.finish(group, "b", {"ok": True}) is False
    assert tracker.results(group) == {"a": {"ok": True, "reward": 1.0}, "b": {"ok": True}}
    assert client.ttl(f"evoenv:run:group:{group}") > 0, "the record expires in Redis"

    never_opened = uuid.uuid4().hex  # e.g. its proposal job was lost before it ran
    assert tracker.expire(never_opened) is True
    tracker.open(never_opened, ["a"])  # the proposal runs late: the group stays closed
    assert tracker.results(never_opened) == {}
    assert tracker.finish(never_opened, "a", {"ok": True}) is False
    assert client.ttl(f"evoenv:run:group:{never_opened}") > 0


def test_concurrent_expire_and_finish_complete_once(client: Any) -> None:
    for _ in range(20):
        group = uuid.uuid4().hex
        GroupTracker(client, "run").open(group, ["a", "b"])
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
        assert outcomes.count(True) == 1, outcomes  # expired once, or completed once


def _expire(client: Any, group: str, barrier: threading.Barrier, outcomes: list[bool]) -> None:
    barrier.wait()
    outcomes.append(GroupTracker(client, "run").expire(group))


def _finish_all(client: Any, group: str, barrier: threading.Barrier, outcomes: list[bool]) -> None:
    barrier.wait()
    tracker = GroupTracker(client, "run")
    outcomes.append(tracker.finish(group, "a", {"ok": True}))
    outcomes.append(tracker.finish(group, "b", {"ok": True}))
