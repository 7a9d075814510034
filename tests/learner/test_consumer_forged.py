"""Entries written straight into a real Redis, as anyone who can write to it could: without a
signature, signed with another key, a signed entry altered, a signed entry with a reward out of
its role's range. Each is dropped, counted, logged and acknowledged; the genuine one is read."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis
import structlog.testing
from support import graded_group

from evoenv_learner.consumer import Dropped, RolloutConsumer
from shared import keys
from shared.config import Settings
from shared.messages import GradedGroup
from shared.rollouts import EntryCheck, append_group, sign
from shared.stream_key import key_id

pytestmark = pytest.mark.integration
RUN = "forged"
STREAM = keys.rollout_stream(RUN)
CHECK = EntryCheck.of(Settings(stream_key="k" * 32))
OTHER_KEY = b"o" * 32


def group(group_id: str, rewards: list[float], role: str = "solver") -> GradedGroup:
    return graded_group(role, rewards, run=RUN, group_id=group_id)


def write_entries(client: redis.Redis) -> None:
    append_group(client, group("genuine", [0.0, 1.0]), CHECK.key)  # as a worker appends
    ((_, real),) = client.xrange(STREAM)
    raw = real[b"group"]
    better = raw.replace(b'"reward":0.0', b'"reward":1.0')  # the genuine id, rewards to taste
    assert better != raw
    client.xadd(STREAM, {"group": better})  # no signature
    client.xadd(STREAM, {"group": better, "sig": sign(OTHER_KEY, STREAM, better)})
    client.xadd(STREAM, {**real, b"group": better})  # the real signature, one reward changed
    renamed = raw.replace(b'"group_id":"genuine"', b'"group_id":"another"')
    client.xadd(STREAM, {**real, b"group": renamed})  # the real signature, the id changed
    # signed, by a worker whose reward figures are not the learner's
    append_group(client, group("too-high", [1.0, 7.0]), CHECK.key)
    append_group(client, group("too-low", [-3.0, 1.0], "generator"), CHECK.key)


def test_forged_and_altered_entries_are_dropped_and_counted_and_the_genuine_one_is_read(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(STREAM)
    write_entries(client)

    async def go() -> tuple[RolloutConsumer, list[str], list[Dropped], int]:
        consumer = RolloutConsumer(aioredis.Redis.from_url(redis_url), RUN, "learner", 4, CHECK)
        await consumer.start()
        got = await consumer.read(20, 100, current_version=0)
        dropped = consumer.take_dropped()
        consumer.done(got)  # trained
        await consumer.acknowledge(consumer.take_for_checkpoint())
        await consumer.client.aclose()
        return consumer, [g.group_id for g in got], dropped, int(client.xlen(STREAM))

    try:
        with structlog.testing.capture_logs() as logs:
            consumer, read, dropped, left = asyncio.run(go())
    finally:
        client.close()
    assert read == ["genuine"]
    assert (consumer.stats.read, consumer.stats.forged, consumer.stats.out_of_range) == (1, 4, 2)
    forged = [line for line in logs if line["event"] == "rollout_forged"]
    assert [line["log_level"] for line in forged] == ["error"] * 4
    assert [line["count"] for line in forged] == [1, 2, 3, 4]
    whys = [line["error"] for line in forged]
    assert "no signature" in whys[0]
    assert f"another key (key id ?; the learner's is {key_id(CHECK.key)})" in whys[1]
    assert all("altered after it was signed" in why for why in whys[2:])
    out = [line for line in logs if line["event"] == "rollout_out_of_range"]
    assert [(line["group"], line["count"]) for line in out] == [("too-high", 1), ("too-low", 2)]
    assert "reward 7.0 outside [0, 1]" in out[0]["error"]
    # a forged entry frees no slot (it names the genuine group); a signed one out of range does
    assert dropped == [
        Dropped("too-high", "solver", "out_of_range"),
        Dropped("too-low", "generator", "out_of_range", ("L1", "L1")),
    ]
    assert left == 0  # every entry acknowledged and deleted: none is read again
