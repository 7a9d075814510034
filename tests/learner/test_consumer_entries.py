"""What the rollout consumer does with one entry it reads (no Redis: `_accept` alone): a
version-1 entry is trained on, one it cannot read is dropped with one log line and
acknowledged with the next checkpoint, so it is never delivered again."""

from __future__ import annotations

import json

import redis.asyncio as aioredis
import structlog.testing

from evoenv_learner.consumer import Dropped, RolloutConsumer
from shared.config import Settings
from shared.messages import GeneratorGroupData
from shared.rollouts import EntryCheck, sign

CHECK = EntryCheck.of(Settings(stream_key="k" * 32))

ENTRY = {
    "run": "r",
    "env_name": "(generator)",
    "env_sha": "",
    "seed": 0,
    "difficulty": 0,
    "prompt": "p",
    "policy_version": 5,
    "completions": [{"text": "class A: pass", "reward": 1.2, "outcome": "scored"}],
}


def entry(version: int, data: dict[str, object], group_id: str) -> dict[bytes, bytes]:
    group = {**ENTRY, "schema_version": version, "group_id": group_id, "role": "generator"}
    raw = json.dumps({**group, "data": data}).encode()
    return {b"group": raw, b"sig": sign(CHECK.key, "evoenv:r:rollouts", raw).encode()}


def consumer() -> RolloutConsumer:
    # never connects: `_accept` does not talk to Redis
    return RolloutConsumer(aioredis.Redis.from_url("redis://127.0.0.1:1"), "r", "l", 4, CHECK)


def test_a_version_1_entry_is_trained_on() -> None:
    c = consumer()
    data = {"funnel": ["L2", "admitted"], "gamma": 0.9, "parents": []}
    group = c._accept("1-0", entry(1, data, "g1"), current_version=5)
    assert group is not None and group.data == GeneratorGroupData(
        funnel=["L2", "admitted"], gamma=0.9
    )
    assert (c.stats.read, c.stats.malformed, c.stats.unreadable) == (1, 0, 0)


def test_an_entry_of_a_newer_version_is_dropped_with_one_line_and_acknowledged() -> None:
    c = consumer()
    with structlog.testing.capture_logs() as logs:
        assert c._accept("1-0", entry(6, {}, "g3"), current_version=5) is None
        assert c._accept("1-0", entry(5, {}, "g3"), current_version=5) is None  # redelivered
    (line,) = logs
    assert line["event"] == "rollout_unreadable" and line["log_level"] == "error"
    assert "schema version 6; this EvoEnv reads versions 1-5" in line["error"]
    assert (c.stats.unreadable, c.stats.duplicates, c.stats.read) == (1, 1, 0)
    assert c.take_dropped() == [Dropped("g3", "generator", "unreadable")]  # its slot is freed
    assert c.take_for_checkpoint() == ["1-0"]  # acknowledged with the next checkpoint


def test_a_version_1_entry_whose_data_does_not_fit_names_the_versions() -> None:
    c = consumer()
    with structlog.testing.capture_logs() as logs:
        assert c._accept("2-0", entry(1, {"funnel": ["L1"], "x": 1}, "g4"), 5) is None
    (line,) = logs
    assert line["event"] == "rollout_malformed"
    assert (line["schema_version"], line["reads_versions"]) == (1, "1-5")
    assert c.take_dropped() == [Dropped("g4", "generator", "malformed")]
    assert c.take_for_checkpoint() == ["2-0"]
