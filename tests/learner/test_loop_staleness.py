"""The learner's loop, whole (tiny model, real Redis, a stand-in vLLM server taking pushes, no
workers): a group fresh when read that aged past `max_staleness` while it waited for its batch
is dropped at the step, counted and logged; the rest of the batch waits for the next group.
Meanwhile proposals that no worker takes expire at their deadline and the next ones are sent.
The stop's checkpoint, holding the queued group, is then resumed."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from model.fake_vllm import FakeServer
from structlog.testing import capture_logs
from tiny_policy import scored_pair

import evoenv_model.models
from evoenv_cli.expiry import group_expiry
from evoenv_learner import loop
from evoenv_learner.loop import LearnerState
from shared.config import Settings
from shared.rollouts import append_group
from shared.stream_key import stream_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
RUN = "stale-at-step"
PUSH_PATHS = [
    "/pause",
    "/resume",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/update_weight_version",
]


async def until(what: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_group_that_aged_while_queued_is_dropped_at_the_step_and_generation_goes_on(
    redis_url: str, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FakeServer()
    for path in PUSH_PATHS:
        server.routes[("POST", path)] = (200, {"success": True})
    monkeypatch.setattr(evoenv_model.models, "prepare_model", lambda settings: model_dir)
    settings = Settings(
        redis_url=redis_url,
        vllm_urls=[server.url],
        data_dir=tmp_path,
        run=RUN,
        grpo={"batch_groups": 2},
        learner={
            "max_staleness": 0,
            "solver_groups_in_flight": 0,
            "generator_groups_in_flight": 1,
            "generation_deadline": 0.5,
        },
    )
    client = redis.Redis.from_url(redis_url)
    queued = lambda: int(client.xpending(f"evoenv:{RUN}:rollouts", "learner")["pending"])  # noqa: E731
    started: list[LearnerState] = []

    async def scenario() -> LearnerState:
        republish = asyncio.Event()
        learner = asyncio.create_task(
            loop.run(
                settings,
                on_start=started.append,
                republish=republish,
                expire_groups=group_expiry,
            )
        )
        await until(lambda: bool(started), 180.0)  # the tiny model loaded: slow on a busy host
        state = started[0]
        append_group(client, scored_pair(RUN, "old", state.version), stream_key(settings))
        await until(lambda: queued() == 1)  # read fresh, queued: its batch needs one more
        republish.set()  # a new version goes live while it waits
        await until(lambda: state.version == 1)
        append_group(client, scored_pair(RUN, "new", 1), stream_key(settings))
        await until(lambda: state.stale_at_step == 1)
        await until(lambda: state.funnel.get("expired", 0) >= 2 * 8)  # G = 8 candidates each
        signal.raise_signal(signal.SIGTERM)
        return await learner

    async def resumed() -> LearnerState:
        def stop_at_once(state: LearnerState) -> None:
            asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGTERM)

        return await loop.run(
            settings, resume=True, on_start=stop_at_once, expire_groups=group_expiry
        )

    try:
        with capture_logs() as logs:
            state = asyncio.run(scenario())
        left_pending = queued()
        again = asyncio.run(resumed())
    finally:
        client.close()
        server.close()
    assert (state.step, state.stale_at_step, state.stale_dropped) == (0, 1, 1)
    (line,) = [e for e in logs if e["event"] == "rollout_stale_at_step"]
    assert (line["group"], line["version"], line["step_version"]) == ("old", 0, 1)
    assert not [e for e in logs if e["event"] == "rollout_stale"], "fresh when read"
    expired = [e for e in logs if e["event"] == "generation_group_expired"]
    sent = [e for e in logs if e["event"] == "generation_group_sent"]
    assert len(expired) >= 2 and len(sent) > len(expired)  # the next one sent each time
    assert state.funnel["expired"] == 8 * len(expired)
    # the stale group is done with and acknowledged; "new" was read and queued, never trained:
    # the stop's checkpoint holds it, pending, for the resumed learner
    assert left_pending == 1
    assert (again.step, again.version) == (0, 2), "resumed: its weights pushed as a new version"
