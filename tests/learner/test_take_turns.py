"""Turn-taking: while the trainer steps, the model servers are held (paused in keep mode) and
released after the step, whatever happens in it; off, nothing is paused. The step's push: an
adapter's while the servers are held, full weights' after the release."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
from model.fake_vllm import FakeServer
from tiny_policy import scored_pair

import evoenv_model.models
from evoenv_learner import loop
from evoenv_learner.loop import taking_turns
from shared.config import Settings
from shared.rollouts import append_group
from shared.stream_key import stream_key


class Servers:
    """A publisher's hold and release, recorded."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def hold(self) -> list[str]:
        self.events.append("hold")
        return ["http://a"]

    def release(self, held: list[str]) -> None:
        self.events.append(f"release {held}")


async def step(servers: Servers, enabled: bool, fail: bool = False) -> None:
    async with taking_turns(servers, enabled):  # type: ignore[arg-type]
        servers.events.append("step")
        if fail:
            raise RuntimeError("the step failed")


def test_the_servers_are_held_for_the_step_and_released_after_it() -> None:
    servers = Servers()
    asyncio.run(step(servers, enabled=True))
    assert servers.events == ["hold", "step", "release ['http://a']"]


def test_the_servers_are_released_when_the_step_fails() -> None:
    servers = Servers()
    with pytest.raises(RuntimeError):
        asyncio.run(step(servers, enabled=True, fail=True))
    assert servers.events == ["hold", "step", "release ['http://a']"]


def test_off_nothing_is_paused() -> None:
    servers = Servers()
    asyncio.run(step(servers, enabled=False))
    assert servers.events == ["step"]


# ------------------------------------------------------ the step's push, before or after release

SERVER_PATHS = [
    "/pause",
    "/resume",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/update_weight_version",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
]


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("lora_rank", "expected"),
    [
        (4, ["/pause", "/v1/load_lora_adapter", "/resume"]),
        (0, ["/pause", "/resume", "/pause", "/collective_rpc", "/resume"]),
    ],
    ids=["adapter-before-release", "full-weights-after-release"],
)
def test_the_step_pushes_an_adapter_before_the_release_and_full_weights_after_it(
    lora_rank: int,
    expected: list[str],
    redis_url: str,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The learner's one step with the servers held (`take_turns`): an adapter push pauses
    nothing, so it is loaded while they are still held (loaded after the release, it waited
    2-33 s on a CPU server for the engine's next step); a full-weight push pauses the servers
    itself, after the release."""
    server = FakeServer()
    for path in SERVER_PATHS:
        server.routes[("POST", path)] = (200, {"success": True})
    server.routes[("GET", "/v1/models")] = (200, {"data": []})  # no adapter loaded yet
    monkeypatch.setattr(evoenv_model.models, "prepare_model", lambda settings: model_dir)
    run = f"push-order-{lora_rank}"
    settings = Settings(
        redis_url=redis_url,
        vllm_urls=[server.url],
        data_dir=tmp_path,
        run=run,
        grpo={"batch_groups": 1, "lora_rank": lora_rank},
        learner={
            "steps": 1,
            "take_turns": True,
            "solver_groups_in_flight": 0,
            "generator_groups_in_flight": 0,
        },
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
    assert (state.step, state.version) == (1, 1)
    wanted = {"/pause", "/resume", "/collective_rpc", "/v1/load_lora_adapter"}
    assert [path for path in server.paths() if path in wanted] == expected
