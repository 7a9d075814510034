"""The rollout consumer against a real Redis: staleness, reclaiming, exactly-once training."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from evoenv_learner.consumer import Dropped, RolloutConsumer
from shared.config import Settings
from shared.messages import GeneratorGroupData, GradedCompletion, GradedGroup
from shared.rollouts import EntryCheck, append_group, sign

pytestmark = pytest.mark.integration
RUN = "test"
CHECK = EntryCheck.of(Settings(stream_key="k" * 32))


def group(group_id: str, version: int) -> GradedGroup:
    completion = GradedCompletion(
        text="<answer>1</answer>",
        token_ids=[1, 2],
        logprobs=[-0.1, -0.2],
        policy_version=version,
        reward=1.0,
        outcome="scored",
    )
    return GradedGroup(
        run=RUN,
        group_id=group_id,
        role="solver",
        env_name="e",
        env_sha="s",
        seed=0,
        difficulty=1,
        prompt="p",
        policy_version=version,
        completions=[completion],
    )


def fill(url: str, groups: list[GradedGroup]) -> None:
    client = redis.Redis.from_url(url)
    for g in groups:
        append_group(client, g, CHECK.key)
    client.close()


def consumer(url: str, name: str, **kwargs: int) -> RolloutConsumer:
    return RolloutConsumer(
        aioredis.Redis.from_url(url),
        RUN,
        name,
        max_staleness=kwargs.get("max_staleness", 4),
        check=CHECK,
        claim_idle_ms=kwargs.get("claim_idle_ms", 60_000),
    )


def stream_length(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.xlen(f"evoenv:{RUN}:rollouts"))
    finally:
        client.close()


async def close(*consumers: RolloutConsumer) -> None:
    for c in consumers:
        await c.client.aclose()


def test_duplicate_appends_make_one_entry(redis_url: str) -> None:
    fill(redis_url, [group("g1", 0), group("g1", 0), group("g2", 0)])
    assert stream_length(redis_url) == 2


def test_stale_groups_are_dropped_and_counted(redis_url: str) -> None:
    fill(redis_url, [group("old", 1), group("edge", 6), group("new", 10)])

    async def go() -> tuple[list[str], int]:
        c = consumer(redis_url, "a", max_staleness=4)
        await c.start()
        got = await c.read(10, 100, current_version=10)
        await close(c)
        return [g.group_id for g in got], c.stats.stale

    ids, stale = asyncio.run(go())
    assert ids == ["edge", "new"]
    assert stale == 1


def test_a_second_consumer_reclaims_what_a_dead_one_left_pending(redis_url: str) -> None:
    fill(redis_url, [group(f"g{i}", 0) for i in range(3)])

    async def go() -> list[str]:
        dead = consumer(redis_url, "dead")
        await dead.start()
        assert len(await dead.read(3, 100, 0)) == 3  # read, then "killed": never acknowledged
        await asyncio.sleep(0.3)
        alive = consumer(redis_url, "alive", claim_idle_ms=200)
        await alive.start()
        got = [g.group_id for g in await alive.read(10, 100, 0)]
        await close(dead, alive)
        return got

    assert sorted(asyncio.run(go())) == ["g0", "g1", "g2"]


def test_resume_trains_each_group_once(redis_url: str) -> None:
    fill(redis_url, [group(f"g{i}", 0) for i in range(4)])

    async def go() -> tuple[list[str], list[str]]:
        first = consumer(redis_url, "learner-1")
        await first.start()
        got = await first.read(2, 100, 0)
        first.done(got)
        trained = [g.group_id for g in got]
        checkpoint_ids = first.take_for_checkpoint()  # g0, g1 are in the checkpoint...
        more = [g.group_id for g in await first.read(1, 100, 0)]  # g2 read after it: lost on crash
        # ...and the learner dies before acknowledging anything. It resumes from the checkpoint:
        second = consumer(redis_url, "learner-1")
        await second.start(checkpointed_unacked=checkpoint_ids)
        after = [g.group_id for g in await second.read(10, 100, 0)]
        await close(first, second)
        return trained + more, after

    before, after = asyncio.run(go())
    assert before == ["g0", "g1", "g2"]
    assert sorted(after) == ["g2", "g3"]  # g2 again (not in the checkpoint), g0/g1 never again
    assert stream_length(redis_url) == 2  # the acknowledged ones are trimmed


def test_a_group_read_but_not_trained_at_a_checkpoint_is_trained_after_resume_counted_once(
    redis_url: str,
) -> None:
    # At a stop, g1 and g2 were read and settled (their counts are in the checkpoint's funnel)
    # but never trained: queued, or in the step the stop abandoned. They are not acknowledged;
    # the resumed learner reads them again, marked settled, so they are trained and not counted
    # a second time. g3, read after the checkpoint, is read again unmarked (the funnel was
    # rolled back with the weights).
    fill(redis_url, [group(f"g{i}", 0) for i in range(5)])

    async def go() -> tuple[list[str], list[str], list[tuple[str, bool]], int]:
        first = consumer(redis_url, "learner")
        await first.start()
        got = await first.read(3, 100, 0)
        first.done(got[:1])  # g0 trained
        acked, held = first.take_for_checkpoint(), first.held()
        await first.acknowledge(acked)
        await first.read(1, 100, 0)  # g3, then the learner dies
        second = consumer(redis_url, "learner")
        await second.start(acked, held=held)
        again = await second.read(10, 100, 0)
        settled = [(g.group_id, second.settled(g)) for g in again]
        second.done(again)
        await second.acknowledge(second.take_for_checkpoint())
        await close(first, second)
        return acked, held, settled, stream_length(redis_url)

    acked, held, settled, left = asyncio.run(go())
    assert len(acked) == 1 and len(held) == 2
    assert sorted(settled) == [("g1", True), ("g2", True), ("g3", False), ("g4", False)]
    assert left == 0  # every entry trained once and acknowledged


def test_own_pending_entries_are_not_read_again(redis_url: str) -> None:
    fill(redis_url, [group("g0", 0), group("g1", 0)])

    async def go() -> tuple[list[str], list[str], int]:
        c = consumer(redis_url, "learner", claim_idle_ms=100)
        await c.start()
        first = [g.group_id for g in await c.read(10, 100, 0)]
        await asyncio.sleep(0.3)  # idle past claim_idle_ms, still waiting for a checkpoint
        again = [g.group_id for g in await c.read(10, 100, 0)]
        duplicates = c.stats.duplicates
        await close(c)
        return first, again, duplicates

    first, again, duplicates = asyncio.run(go())
    assert sorted(first) == ["g0", "g1"]
    assert again == [] and duplicates == 0


def test_a_restarted_consumer_reads_all_its_pending_entries_in_small_batches(
    redis_url: str,
) -> None:
    fill(redis_url, [group(f"g{i}", 0) for i in range(5)])

    async def go() -> list[str]:
        dead = consumer(redis_url, "learner")
        await dead.start()
        assert len(await dead.read(5, 100, 0)) == 5  # read, never checkpointed: pending
        again = consumer(redis_url, "learner")  # the same learner, restarted
        await again.start()
        got: list[str] = []
        for _ in range(8):
            got += [g.group_id for g in await again.read(1, 50, 0)]
        await close(dead, again)
        return got

    assert go_sorted(asyncio.run(go())) == ["g0", "g1", "g2", "g3", "g4"]


def go_sorted(ids: list[str]) -> list[str]:
    assert len(ids) == len(set(ids)), ids
    return sorted(ids)


def test_dropped_groups_are_handed_on_so_their_slots_are_freed(redis_url: str) -> None:
    stale_generator = group("gen", 1).model_copy(
        update={
            "role": "generator",
            "data": GeneratorGroupData(funnel=["L1", "admitted"], gamma=1.0),
        }
    )
    fill(redis_url, [stale_generator, group("solver-old", 1), group("fresh", 10)])
    client = redis.Redis.from_url(redis_url)
    stream = f"evoenv:{RUN}:rollouts"
    for raw in (b'{"group_id": "broken", "role": "generator", "run": 1}', b"not json"):
        # signed, as a worker of another schema version writes; the second names nothing: its
        # slot waits for the deadline
        client.xadd(stream, {"group": raw, "sig": sign(CHECK.key, stream, raw)})
    client.close()

    async def go() -> tuple[list[str], list[Dropped]]:
        c = consumer(redis_url, "a", max_staleness=4)
        await c.start()
        got = await c.read(10, 100, current_version=10)
        dropped = c.take_dropped()
        assert c.take_dropped() == [], "handed on once"
        await close(c)
        return [g.group_id for g in got], dropped

    ids, dropped = asyncio.run(go())
    assert ids == ["fresh"]
    assert dropped == [
        Dropped("gen", "generator", "stale", ("L1", "admitted")),
        Dropped("solver-old", "solver", "stale"),
        Dropped("broken", "generator", "malformed"),
    ]
