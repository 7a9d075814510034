"""`evoenv eval --suite reasoning-gym` through the command line: against a fake server (the
JSON's shape and what is sent, no model), then against the real small model (`slow`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_vllm import FakeServer

from evoenv_model.models import TEST_MODEL
from evoenv_model.serve import VllmServer
from shared.environment import ANSWER_INSTRUCTION

REPO = Path(__file__).resolve().parents[2]
TASK = "chain_sum"


def evoenv(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The `evoenv` entry point of this interpreter, in a real subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "from evoenv_cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, **env},
        check=False,
    )


ANSWER = {
    "prompt_token_ids": [1, 2],
    "choices": [
        {
            "index": 0,
            "message": {"content": "<answer>-1</answer>"},
            "token_ids": [7],
            "logprobs": {"content": [{"token": "t", "logprob": -0.1}]},
            "finish_reason": "stop",
        }
    ],
}
"""A chat completion as vLLM returns it, answering -1."""


def assert_shape(result: dict[str, Any], n: int) -> None:
    assert result["suite"] == "reasoning-gym" and isinstance(result["seed"], int)
    assert result["instances"] == n and result[f"instances_{TASK}"] == n
    for key in ("pass_rate", "mean_score", "ci_low", "ci_high", f"pass_rate_{TASK}"):
        assert 0.0 <= result[key] <= 1.0, key
    assert result["ci_low"] <= result["pass_rate"] <= result["ci_high"]
    assert 0 <= result["format_errors"] == result[f"format_errors_{TASK}"] <= n


def test_json_from_a_fake_server(fake_server: FakeServer) -> None:
    fake_server.routes[("GET", "/health")] = (200, {})
    fake_server.routes[("POST", "/v1/chat/completions/render")] = (404, {"detail": "Not Found"})
    fake_server.routes[("POST", "/v1/chat/completions")] = (200, ANSWER)
    done = evoenv(
        "eval", "--suite", "reasoning-gym", "-n", "3", "--task", TASK, "--json",
        env={"EVOENV_VLLM_URLS": fake_server.url, "EVOENV_MODEL": "m",
             "EVOENV_GRPO__MAX_TOKENS": "99"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert_shape(result, 3)
    assert result["pass_rate"] == 0.0 and result["format_errors"] == 0
    sent = [body for method, path, body in fake_server.hits if path == "/v1/chat/completions"]
    assert len(sent) == 3
    assert {(b["model"], b["temperature"], b["max_tokens"]) for b in sent} == {("m", 0.0, 99)}
    assert all(b["messages"][0]["content"].endswith(ANSWER_INSTRUCTION) for b in sent)


def test_in_lora_mode_it_asks_the_newest_adapter_the_servers_hold(
    fake_servers: Callable[[], FakeServer],
) -> None:
    """`EVOENV_GRPO__LORA_RANK` > 0: every question goes to the newest `policy-v{N}` listed
    at /v1/models (other adapters are not the policy's), not to the base model; a server
    without it (404) passes the request on to one that has it."""
    old, new = fake_servers(), fake_servers()
    listed = {
        old: ["m", "policy-v3", "policy-v4"],
        new: ["m", "policy-v4", "policy-v5", "policy-vx", "someone-elses-v9"],
    }
    for server, names in listed.items():
        server.routes[("GET", "/health")] = (200, {})
        data = [{"id": n, "parent": None if n == "m" else "m"} for n in names]
        server.routes[("GET", "/v1/models")] = (200, {"data": data})
    old.routes[("POST", "/v1/chat/completions")] = (404, {"error": "model does not exist"})
    new.routes[("POST", "/v1/chat/completions")] = (200, ANSWER)
    done = evoenv(
        "eval", "--suite", "reasoning-gym", "-n", "2", "--task", TASK, "--json",
        env={"EVOENV_VLLM_URLS": f"{old.url},{new.url}", "EVOENV_MODEL": "m",
             "EVOENV_GRPO__LORA_RANK": "8"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_shape(json.loads(done.stdout), 2)
    asked = [body["model"] for server in (old, new) for method, path, body in server.hits
             if path == "/v1/chat/completions"]  # fmt: skip
    assert set(asked) == {"policy-v5"} and len(asked) >= 2


@pytest.mark.slow
def test_eval_reasoning_gym_on_the_small_model(vllm_server: VllmServer) -> None:
    done = evoenv(
        "eval", "--suite", "reasoning-gym", "-n", "2", "--task", TASK, "--json",
        env={"EVOENV_VLLM_URLS": vllm_server.url, "EVOENV_MODEL": TEST_MODEL,
             "EVOENV_GRPO__MAX_TOKENS": "128"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_shape(json.loads(done.stdout), 2)
