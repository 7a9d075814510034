"""The model server's bearer token (`serve.api_key`): vLLM's own app, built as `evoenv serve`
starts it but with no engine, refuses every route but /health without the token; the workers'
and the learner's clients send it from the settings."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from fake_vllm import FakeServer
from starlette.routing import Mount
from starlette.testclient import TestClient

from evoenv_learner.publisher import make_publisher
from evoenv_model.serve import server_command, server_env
from evoenv_model.server_auth import API_KEY_VARIABLE, BearerToken
from evoenv_worker.solver_completions import make_client
from shared.config import Settings
from shared.inference import InferenceClient, InferenceError

TOKEN = "t0ken-for-tests-only-0123456789"
OK = (200, {"success": True, "status": "ok"})
CHAT = {
    "prompt_token_ids": [1, 2],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris."},
            "token_ids": [11, 12, 2],
            "finish_reason": "stop",
            "logprobs": {"content": [{"token": "t", "logprob": -0.1, "top_logprobs": []}] * 3},
        }
    ],
}


def _settings(**more: Any) -> Settings:
    """Settings as a server in LoRA mode sees them (the adapter routes open too)."""
    return Settings(serve={"api_key": TOKEN}, grpo={"lora_rank": 8}, **more)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vllm_app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """vLLM's FastAPI app from the command line and environment `evoenv serve` gives the
    server (development endpoints on, `--middleware`, the token in the environment), built
    without an engine or a model: its routes exist, their handlers fail past the check. The
    environment is this process's again once the app has made its middleware."""
    settings = _settings()
    command = server_command(settings, tmp_path_factory.mktemp("model"), gpu=False)
    with pytest.MonkeyPatch.context() as env, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit, vLLM's own
        for name, value in server_env(settings, gpu=False).items():
            env.setenv(name, value)
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(command[3:])
        app = build_app(args, ("generate",))
        TestClient(app, raise_server_exceptions=False).get("/health")  # makes the middleware
    return app


def _requests(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route of `app`, path parameters filled in, a mount's root."""
    found = []
    for route in app.routes:
        if isinstance(route, Mount):
            found.append(("GET", route.path + "/"))
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        found += [(method, path) for method in sorted(route.methods or ())]
    return found


@pytest.mark.integration  # building vLLM's app (its imports) takes a minute or two
def test_every_route_but_health_needs_the_token(vllm_app: Any) -> None:
    requests = _requests(vllm_app)
    paths = {path for _, path in requests}
    # the weight-replacing endpoints are among them (development and LoRA endpoints are on)
    for path in ("/update_weights", "/collective_rpc", "/pause", "/v1/load_lora_adapter"):
        assert path in paths
    client = TestClient(vllm_app, raise_server_exceptions=False)
    refused, let_in = [], []
    for method, path in requests:
        bare = client.request(method, path).status_code
        wrong = client.request(method, path, headers={"Authorization": "Bearer nope"})
        right = client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
        if path == "/health":
            assert bare != 401
            continue
        if bare != 401 or wrong.status_code != 401:
            let_in.append(f"{method} {path}: {bare}, wrong token {wrong.status_code}")
        if right.status_code == 401:
            refused.append(f"{method} {path}")
    assert not let_in, f"answered without the token: {let_in}"
    assert not refused, f"refused with the token: {refused}"


def test_the_check_will_not_start_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match=API_KEY_VARIABLE):
        BearerToken(lambda scope, receive, send: None)  # type: ignore[arg-type,return-value]


def test_no_token_set_means_no_check_and_no_token_in_the_environment(tmp_path: Path) -> None:
    settings = Settings(serve={"api_key": ""})  # type: ignore[arg-type]
    assert "--middleware" not in server_command(settings, tmp_path, gpu=False)
    assert API_KEY_VARIABLE not in server_env(settings, gpu=False)
    with_token = _settings()
    command = server_command(with_token, tmp_path, gpu=False)
    assert TOKEN not in " ".join(command), "the token stays off the command line"
    assert server_env(with_token, gpu=False)[API_KEY_VARIABLE] == TOKEN


def test_the_workers_client_sends_the_token() -> None:
    server = FakeServer(token=TOKEN)
    try:
        server.routes[("POST", "/v1/chat/completions/render")] = (403, {"error": "disabled"})
        server.routes[("POST", "/v1/chat/completions")] = (200, CHAT)
        ask = [{"role": "user", "content": "hi"}]
        with InferenceClient([server.url], "m") as bare, pytest.raises(InferenceError, match="401"):
            bare.chat(ask)
        settings = Settings(vllm_urls=[server.url], serve={"api_key": TOKEN})  # type: ignore[arg-type]
        with make_client(settings, lambda: 3) as client:
            (completion,) = client.chat(ask)
        assert completion.text == "Paris."
    finally:
        server.close()


@pytest.mark.integration
def test_the_learners_weight_push_sends_the_token(redis_url: str, tmp_path: Path) -> None:
    server = FakeServer(token=TOKEN)
    for path in ("/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"):
        server.routes[("POST", path)] = OK
    server.routes[("POST", "/resume")] = OK
    client = redis.Redis.from_url(redis_url)
    model = torch.nn.Linear(2, 2)
    settings = Settings(redis_url=redis_url, vllm_urls=[server.url], serve={"api_key": TOKEN})  # type: ignore[arg-type]
    publisher = make_publisher(settings, client, model, tmp_path / "push", tmp_path / "base")
    try:
        assert publisher.publish(model) == 1
        assert "/collective_rpc" in server.paths()
    finally:
        publisher.close()
        client.close()
        server.close()
