"""A step's logged figures carry the learner's true peak resident size (the high-water mark
since the last step's reading), which sees memory the step held and gave back: the reading
after the step (`rss_gib`) does not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from model.fake_vllm import FakeServer
from tiny_policy import scored_pair

import evoenv_model.models
from evoenv_learner import loop
from evoenv_learner.trainer import Trainer
from shared.config import Settings
from shared.rollouts import append_group
from shared.stream_key import stream_key

SERVER_PATHS = ["/pause", "/resume", "/collective_rpc", "/reset_prefix_cache"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_step_logs_its_peak_memory_above_the_reading_after_it(
    redis_url: str, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = Trainer.step

    def step_holding_half_a_gib(self: Trainer, groups: Any) -> Any:
        held = bytearray(512 * 2**20)  # resident at once, given back when the step ends
        del held
        return step(self, groups)

    monkeypatch.setattr(Trainer, "step", step_holding_half_a_gib)
    server = FakeServer()
    for path in SERVER_PATHS:
        server.routes[("POST", path)] = (200, {"success": True})
    server.routes[("POST", "/update_weight_version")] = (404, {})
    monkeypatch.setattr(evoenv_model.models, "prepare_model", lambda settings: model_dir)
    run = "step-memory"
    settings = Settings(
        redis_url=redis_url,
        vllm_urls=[server.url],
        data_dir=tmp_path,
        run=run,
        grpo={"batch_groups": 1},
        learner={"steps": 1, "solver_groups_in_flight": 0, "generator_groups_in_flight": 0},
    )
    client = redis.Redis.from_url(redis_url)
    try:
        state = asyncio.run(
            loop.run(
                settings,
                on_start=lambda _: append_group(
                    client, scored_pair(run, "g", 0), stream_key(settings)
                ),
            )
        )
    finally:
        client.close()
        server.close()
    assert state.step == 1
    values = state.last_metrics
    assert values["peak_rss_gib"] - values["rss_gib"] > 0.4, values
