"""The policy version in Redis, the weight publisher's push sequence and its selection
(`serve.weight_push`, through `make_publisher` as the learner builds it), against fake servers.

The real push (a fine-tuned model changing what vLLM generates) is in test_weight_push.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import torch
from fake_vllm import FakeServer
from safetensors.torch import load_file

from evoenv_learner import publisher as publisher_module
from evoenv_learner.publisher import PushFailed, ReloadPublisher, make_publisher
from shared import policy
from shared.config import Settings
from shared.errors import EvoEnvError

pytestmark = pytest.mark.integration

OK = (200, {"success": True, "status": "ok"})
PUSH_PATHS = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]


class Tied(torch.nn.Module):
    """Embeddings shared with the output layer, as in SmolLM2 and Qwen2.5-0.5B."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight


def healthy(server: FakeServer) -> FakeServer:
    for path in [*PUSH_PATHS, "/resume"]:
        server.routes[("POST", path)] = OK
    return server


def test_policy_version_only_goes_up(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert policy.read_version(client) == 0
    assert policy.publish_version(client, 1) == 1
    assert policy.publish_version(client, 5) == 5
    for stale in (5, 3):
        with pytest.raises(policy.VersionNotIncreased):
            policy.publish_version(client, stale)
    assert policy.read_version(client) == 5

    async def run() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        assert await policy.read_version_async(aclient) == 5
        assert await policy.publish_version_async(aclient, 6) == 6
        with pytest.raises(policy.VersionNotIncreased):
            await policy.publish_version_async(aclient, 6)
        await aclient.aclose()

    asyncio.run(run())
    client.close()


def test_push_sequence_then_version_bump(
    redis_url: str, fake_servers: Callable[[], FakeServer], tmp_path: Path
) -> None:
    servers = [healthy(fake_servers()), healthy(fake_servers())]
    client = redis.Redis.from_url(redis_url)
    publisher = ReloadPublisher(
        [s.url for s in servers], client, tmp_path / "push", tmp_path / "base", backoff=0.01
    )
    model = Tied()
    assert publisher.publish(model) == 1
    assert publisher.publish(model) == 2
    assert policy.read_version(client) == 2
    for server in servers:
        assert server.paths() == [*PUSH_PATHS, "/resume"] * 2
        reloads = [body for method, path, body in server.hits if path == "/collective_rpc"]
        assert reloads[-1] == {
            "method": "reload_weights",
            "kwargs": {"weights_path": str(tmp_path / "push" / "v00000002")},
        }
        labels = [body for _, path, body in server.hits if path == "/update_weight_version"]
        assert labels == [{"new_version": "1"}, {"new_version": "2"}]
    saved = load_file(tmp_path / "push" / "v00000002" / "model.safetensors")
    assert list(saved) == ["embed.weight"] and saved["embed.weight"].dtype == torch.bfloat16
    with pytest.raises(policy.VersionNotIncreased):
        publisher.publish(model, version=2)
    publisher.close()
    client.close()


def test_failed_reload_rolls_back_resumes_all_and_keeps_the_version(
    redis_url: str, fake_servers: Callable[[], FakeServer], tmp_path: Path
) -> None:
    good, bad = healthy(fake_servers()), healthy(fake_servers())
    bad.routes[("POST", "/collective_rpc")] = (500, {"error": "reload failed"})
    client = redis.Redis.from_url(redis_url)
    policy.publish_version(client, 3)
    base = tmp_path / "base"
    publisher = ReloadPublisher(
        [good.url, bad.url], client, tmp_path / "push", base, attempts=2, backoff=0.01
    )
    with pytest.raises(PushFailed, match="policy version is 3"):
        publisher.publish(Tied())
    assert policy.read_version(client) == 3
    for server in (good, bad):
        assert server.paths()[0] == "/pause" and server.paths()[-1] == "/resume"
        reloads = [b["kwargs"]["weights_path"] for _, p, b in server.hits if p == "/collective_rpc"]
        assert reloads[-1] == str(base)  # the previous weights are put back
    labels = [b for _, p, b in good.hits if p == "/update_weight_version"]
    assert labels == [{"new_version": "3"}]  # relabelled with the old version, never the new
    assert "/update_weight_version" not in bad.paths()  # its roll back failed too (logged)
    assert bad.paths().count("/collective_rpc") == 2 + 3  # push (2 attempts), roll back (3)
    publisher.close()
    client.close()


def test_a_server_that_cannot_pause_fails_the_push_and_the_others_resume(
    redis_url: str, fake_servers: Callable[[], FakeServer], tmp_path: Path
) -> None:
    good, bad = healthy(fake_servers()), fake_servers()  # `bad` answers 500 to everything
    client = redis.Redis.from_url(redis_url)
    publisher = ReloadPublisher(
        [good.url, bad.url], client, tmp_path / "push", tmp_path / "base", backoff=0.01
    )
    with pytest.raises(PushFailed, match="pause failed 3 times"):
        publisher.publish(Tied())
    assert good.paths() == ["/pause", "/resume"]
    assert bad.paths() == ["/pause"] * 3
    assert policy.read_version(client) == 0
    publisher.close()
    client.close()


def test_serve_weight_push_selects_the_publisher(
    redis_url: str,
    fake_servers: Callable[[], FakeServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = healthy(fake_servers())
    client = redis.Redis.from_url(redis_url)
    model = Tied()

    def settings(push: str) -> Settings:
        return Settings(redis_url=redis_url, vllm_urls=[server.url], serve={"weight_push": push})  # type: ignore[arg-type]

    reload = make_publisher(settings("reload"), client, model, tmp_path / "push", tmp_path / "base")
    assert isinstance(reload, ReloadPublisher)
    assert reload.publish(model) == 1
    pushed = [b["kwargs"]["weights_path"] for _, p, b in server.hits if p == "/collective_rpc"]
    assert pushed == [str(tmp_path / "push" / "v00000001")]
    # By default a push keeps the requests in flight and recomputes their cache afterwards.
    assert "/pause?mode=keep" in server.targets
    assert "/reset_prefix_cache?reset_running_requests=true" in server.targets
    reload.close()

    if not torch.cuda.is_available():  # the real NCCL publisher is chosen, and needs a GPU
        with pytest.raises(EvoEnvError, match="needs a GPU"):
            make_publisher(settings("nccl"), client, model, tmp_path / "push", tmp_path / "base")
    built: list[tuple[Any, ...]] = []

    class Nccl:
        def __init__(self, urls: list[str], redis_client: Any, module: Any, **kwargs: Any) -> None:
            built.append((urls, module, kwargs["master_address"]))

    monkeypatch.setattr(publisher_module, "NcclPublisher", Nccl)
    nccl = make_publisher(settings("nccl"), client, model, tmp_path / "push", tmp_path / "base")
    assert isinstance(nccl, Nccl)
    assert built == [([server.url], model, "127.0.0.1")]
    assert server.paths().count("/collective_rpc") == 1, "no reload through the NCCL path"
    client.close()


def test_hold_pauses_in_keep_mode_and_release_resumes_only_the_servers_held(
    redis_url: str, fake_servers: Callable[[], FakeServer], tmp_path: Path
) -> None:
    """Turn-taking (`learner.take_turns`): the servers are paused with their requests kept for
    a step; one that cannot be paused is left generating (the step only runs slower)."""
    good, broken = healthy(fake_servers()), fake_servers()
    client = redis.Redis.from_url(redis_url)
    publisher = ReloadPublisher(
        [good.url, broken.url], client, tmp_path / "push", tmp_path / "base", backoff=0.01
    )
    held = publisher.hold()
    assert held == [good.url]
    assert good.targets == ["/pause?mode=keep"]
    publisher.release(held)
    assert good.paths() == ["/pause", "/resume"]
    assert "/resume" not in broken.paths()
    publisher.close()
    client.close()
