"""The inference client without a model: request bodies, response parsing, retries, errors."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fake_vllm import FakeServer

from shared.errors import ServiceUnavailable
from shared.inference import (
    AsyncInferenceClient,
    InferenceClient,
    InferenceError,
    Sampling,
    chat_body,
    generate_body,
    parse_chat,
    parse_completions,
    parse_generate,
)

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _logprobs(*values: float) -> dict[str, Any]:
    return {"content": [{"token": "t", "logprob": v, "top_logprobs": []} for v in values]}


GENERATE = {
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 1,
            "text": "B",
            "token_ids": [9, 2],
            "finish_reason": "stop",
            "stop_reason": None,
            "weight_versions": [
                {"version": "5", "start": 1, "end": 2},
                {"version": "4", "start": 0, "end": 1},
            ],
            "logprobs": _logprobs(-0.5, -0.25),
        },
        {
            "index": 0,
            "text": "A",
            "token_ids": [7],
            "finish_reason": "length",
            "weight_versions": [{"version": "default", "start": 0, "end": 1}],
            "logprobs": _logprobs(-1.0),
        },
    ],
}
CHAT = {
    "prompt_token_ids": [1, 2],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris."},
            "token_ids": [11, 12, 2],
            "finish_reason": "stop",
            "logprobs": _logprobs(-0.1, -0.2, -0.3),
        }
    ],
}
COMPLETIONS = {
    "choices": [
        {
            "index": 0,
            "text": " Paris",
            "token_ids": [7042],
            "prompt_token_ids": [504, 3575],
            "finish_reason": "length",
            "logprobs": {"token_logprobs": [-0.27], "tokens": [" Paris"]},
        }
    ]
}


def test_sampling_fields_ask_for_structured_output() -> None:
    fields = Sampling(max_tokens=8, temperature=0.0, top_k=5, stop=("\n",), json_schema=SCHEMA)
    assert fields.fields() == {
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "top_k": 5,
        "stop": ["\n"],
        "structured_outputs": {"json": SCHEMA},
    }
    assert Sampling(grammar="root ::= 'a'").fields()["structured_outputs"] == {
        "grammar": "root ::= 'a'"
    }
    with pytest.raises(ValueError):
        Sampling(json_schema=SCHEMA, grammar="x").fields()


def test_chat_body_asks_for_token_ids_and_sampled_logprobs() -> None:
    body = chat_body("m", [{"role": "user", "content": "hi"}], Sampling(n=4))
    assert body["return_token_ids"] is True
    assert body["logprobs"] is True and body["top_logprobs"] == 0
    assert body["n"] == 4 and body["model"] == "m"


def test_generate_body_from_render() -> None:
    rendered = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}, "output_mode": "tokens"}
    body = generate_body([rendered])
    assert body["output_mode"] == "text" and body["return_token_ids"] is True
    assert body["token_ids"] == [1, 2] and body["sampling_params"] == {"max_tokens": 3}
    with pytest.raises(InferenceError):
        generate_body([rendered, rendered])


def test_parse_generate_takes_the_oldest_weight_version() -> None:
    first, second = parse_generate(GENERATE, "http://s", fallback=3)
    assert (first.text, first.token_ids, first.logprobs) == ("A", [7], [-1.0])
    assert first.finish_reason == "length"
    # "default" (never pushed) is no policy version: the version read before the request.
    assert (first.policy_version, first.version_source) == (3, "redis")
    assert (second.policy_version, second.version_source) == (4, "server")
    # the spans in token order: a push came after its first token
    assert (first.weight_versions, second.weight_versions) == ([], [4, 5])
    assert second.prompt_token_ids == [1, 2, 3] and second.server == "http://s"


def test_parse_chat_and_completions() -> None:
    (chat,) = parse_chat(CHAT, "http://s", fallback=None)
    assert chat.text == "Paris." and chat.token_ids == [11, 12, 2]
    assert chat.logprobs == [-0.1, -0.2, -0.3] and chat.prompt_token_ids == [1, 2]
    assert (chat.policy_version, chat.version_source) == (0, "none")
    (done,) = parse_completions(COMPLETIONS, "http://s", fallback=2)
    assert done.prompt_token_ids == [504, 3575] and done.logprobs == [-0.27]
    assert (done.policy_version, done.version_source) == (2, "redis")


@pytest.mark.parametrize(
    "broken",
    [
        {"prompt_token_ids": [1], "choices": []},
        {"choices": [{**CHAT["choices"][0], "token_ids": [1]}], "prompt_token_ids": [1]},  # type: ignore[dict-item]
        {"choices": CHAT["choices"]},
    ],
    ids=["no-choices", "logprob-count", "no-prompt-ids"],
)
def test_parse_rejects_incomplete_answers(broken: dict[str, Any]) -> None:
    with pytest.raises(InferenceError):
        parse_chat(broken, "http://s", fallback=None)


def test_server_answering_500_fails_clearly_after_bounded_retries(fake_server: FakeServer) -> None:
    client = InferenceClient([fake_server.url], "m", attempts=3, backoff=0.01)
    start = time.monotonic()
    with client, pytest.raises(ServiceUnavailable, match=r"after 3 attempts.*answered 500"):
        client.chat([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 5
    assert fake_server.paths() == ["/v1/chat/completions/render"] * 3


def test_server_that_is_down_fails_clearly(dead_url: str) -> None:
    client = InferenceClient([dead_url], "m", attempts=2, backoff=0.01, connect_timeout=1.0)
    start = time.monotonic()
    with client, pytest.raises(ServiceUnavailable, match="after 2 attempts"):
        client.complete("hello")
    assert time.monotonic() - start < 5


def test_a_request_waits_for_a_restarting_server_and_is_sent_the_moment_it_is_back(
    dead_url: str,
) -> None:
    # a vLLM restart: nothing listens for a while, then a server answers where it was; the
    # request is sent again within a poll of its /health, not after a job retry's backoff
    started: list[tuple[FakeServer, float]] = []

    def come_back() -> None:
        time.sleep(2.0)
        server = FakeServer(port=int(dead_url.rsplit(":", 1)[1]))
        server.routes[("GET", "/health")] = (200, {})
        server.routes[("POST", "/v1/chat/completions/render")] = (200, {"token_ids": [1, 2]})
        server.routes[("POST", "/inference/v1/generate")] = (200, GENERATE)
        started.append((server, time.monotonic()))

    back = threading.Thread(target=come_back)
    back.start()
    client = InferenceClient([dead_url], "m", attempts=2, backoff=0.01, outage_wait=30.0)
    try:
        with client:
            answer = client.chat([{"role": "user", "content": "hi"}])
        served = time.monotonic()
        back.join()
        server, up = started[0]
        assert answer[0].text == "A" and server.paths()[-1] == "/inference/v1/generate"
        assert served - up < 1.5
    finally:
        back.join()
        for server, _ in started:
            server.close()
    # a server that stays away: the request gives up once its wait is spent
    start = time.monotonic()
    client = InferenceClient([dead_url], "m", attempts=2, backoff=0.01, outage_wait=1.0)
    gave_up = r"after 2 attempts.*none came back within 1 s"
    with client, pytest.raises(ServiceUnavailable, match=gave_up):
        client.chat([{"role": "user", "content": "hi"}])
    assert 1.0 <= time.monotonic() - start < 5


def test_the_wait_for_a_server_starts_when_it_goes_away(
    fake_servers: Callable[[], FakeServer],
) -> None:
    # a request that had generated longer than the wait when its server went away still waits
    first = fake_servers()
    first.routes[("POST", "/v1/chat/completions/render")] = (503, {"error": "dying"})
    first.delays["/v1/chat/completions/render"] = 4.0
    port = int(first.url.rsplit(":", 1)[1])
    second: list[FakeServer] = []

    def restart() -> None:
        time.sleep(3.0)
        first.close()  # the request in flight still gets its 503 at 4 s
        time.sleep(2.0)
        server = FakeServer(port=port)
        server.routes[("GET", "/health")] = (200, {})
        server.routes[("POST", "/v1/chat/completions/render")] = (200, {"token_ids": [1, 2]})
        server.routes[("POST", "/inference/v1/generate")] = (200, GENERATE)
        second.append(server)

    back = threading.Thread(target=restart)
    back.start()
    client = InferenceClient([first.url], "m", attempts=2, backoff=0.01, outage_wait=3.0)
    try:
        with client:
            answer = client.chat([{"role": "user", "content": "hi"}])
        assert answer[0].text == "A"
    finally:
        back.join()
        for server in second:
            server.close()


def test_wait_ready_gives_up_after_its_timeout(dead_url: str) -> None:
    client = InferenceClient([dead_url], "m")
    with client, pytest.raises(ServiceUnavailable, match="not healthy"):
        client.wait_ready(timeout=1.0)


def test_a_refused_request_is_not_retried(fake_server: FakeServer) -> None:
    fake_server.routes[("POST", "/v1/chat/completions/render")] = (400, {"error": "too long"})
    client = InferenceClient([fake_server.url], "m", attempts=3, backoff=0.01)
    with client, pytest.raises(InferenceError, match="400") as caught:
        client.chat([{"role": "user", "content": "hi"}])
    assert caught.value.status == 400
    assert len(fake_server.hits) == 1


def test_requests_move_to_the_next_server_on_failure(
    fake_servers: Callable[[], FakeServer],
) -> None:
    bad, good = fake_servers(), fake_servers()
    good.routes[("POST", "/v1/chat/completions/render")] = (200, {"token_ids": [1, 2]})
    good.routes[("POST", "/inference/v1/generate")] = (200, GENERATE)
    with InferenceClient([bad.url, good.url], "m", attempts=2, backoff=0.01) as client:
        results = [client.chat([{"role": "user", "content": "hi"}]) for _ in range(4)]
    assert all(r[1].policy_version == 4 and r[1].server == good.url for r in results)
    # Spread: two requests started on each server; the ones on the broken server moved on.
    assert len(bad.hits) == 2
    assert good.paths().count("/inference/v1/generate") == 4


def test_servers_without_the_token_route_use_the_openai_route(fake_server: FakeServer) -> None:
    fake_server.routes[("POST", "/v1/chat/completions/render")] = (403, {"error": "disabled"})
    fake_server.routes[("POST", "/v1/chat/completions")] = (200, CHAT)
    with InferenceClient([fake_server.url], "m", version_source=lambda: 6) as client:
        for _ in range(2):
            (completion,) = client.chat([{"role": "user", "content": "hi"}])
            assert (completion.policy_version, completion.version_source) == (6, "redis")
    # The render route is tried once, then remembered as missing.
    assert fake_server.paths() == [
        "/v1/chat/completions/render",
        "/v1/chat/completions",
        "/v1/chat/completions",
    ]


def test_async_client_same_behaviour(fake_server: FakeServer, dead_url: str) -> None:
    fake_server.routes[("POST", "/v1/completions/render")] = (200, [{"token_ids": [1]}])
    fake_server.routes[("POST", "/inference/v1/generate")] = (200, GENERATE)

    async def version() -> int:
        return 1

    async def run() -> None:
        async with AsyncInferenceClient([fake_server.url], "m", version_source=version) as client:
            results = await asyncio.gather(*(client.complete([1, 2]) for _ in range(3)))
            assert [r[0].policy_version for r in results] == [1, 1, 1]
        broken = AsyncInferenceClient([dead_url], "m", backoff=0.01)
        async with broken:
            with pytest.raises(ServiceUnavailable):
                await broken.chat([{"role": "user", "content": "hi"}])

    asyncio.run(run())


class StoppedClock:
    """A serving clock the test stops and starts: it stands still while `paused`."""

    def __init__(self) -> None:
        self.paused = False
        self._last = time.monotonic()
        self._now = 0.0

    def __call__(self) -> float:
        now = time.monotonic()
        if not self.paused:
            self._now += now - self._last
        self._last = now
        return self._now


def test_a_request_timed_on_the_serving_clock_leaves_paused_seconds_out(
    fake_server: FakeServer,
) -> None:
    """The workers' requests: `request_timeout` counts generating seconds only, so a request
    frozen by a push or a training step is not cut off; the wall timeout still bounds it."""
    fake_server.routes[("POST", "/v1/chat/completions/render")] = (200, {"token_ids": [1, 2]})
    fake_server.routes[("POST", "/inference/v1/generate")] = (200, GENERATE)
    fake_server.delays["/inference/v1/generate"] = 1.2
    clock = StoppedClock()
    hi = [{"role": "user", "content": "hi"}]

    def client(**timing: Any) -> InferenceClient:
        return InferenceClient([fake_server.url], "m", attempts=1, backoff=0.01, **timing)

    clock.paused = True  # paused for the whole answer: 0 s of generation
    with client(request_timeout=0.5, serving_clock=clock, wall_timeout=5.0) as paused:
        assert paused.chat(hi)[1].policy_version == 4
    clock.paused = False  # the same request while the servers generate: past 0.5 s
    with client(request_timeout=0.5, serving_clock=clock, wall_timeout=5.0) as running:
        began = time.monotonic()
        with pytest.raises(ServiceUnavailable, match=r"0\.5 s of generation"):
            running.chat(hi)
        assert time.monotonic() - began < 1.1, "it waited for the answer"
    clock.paused = True  # paused, but past the wall timeout
    walled = client(request_timeout=0.5, serving_clock=clock, wall_timeout=0.6)
    with walled, pytest.raises(ServiceUnavailable, match="timed out"):
        walled.chat(hi)
    plain = client(request_timeout=0.5)  # without a clock: the wall clock, as before
    with plain, pytest.raises(ServiceUnavailable):
        plain.chat(hi)


def test_lora_mode_asks_for_the_newest_adapter_and_retries_one_that_is_gone(
    fake_servers: Callable[[], FakeServer],
) -> None:
    """`adapters=True`: the request names the version's adapter (`policy-v{N}`, the base model
    at version 0), the completion counts as that version, and a server that does not have it
    (404) is retried, asking for the newest version again."""
    gone, live = fake_servers(), fake_servers()
    gone.routes[("POST", "/v1/chat/completions")] = (404, {"error": "model does not exist"})
    live.routes[("POST", "/v1/chat/completions")] = (200, CHAT)
    versions = iter([3, 5])
    with InferenceClient(
        [gone.url, live.url],
        "m",
        version_source=lambda: next(versions),
        adapters=True,
        backoff=0.0,
    ) as client:
        (completion,) = client.chat([{"role": "user", "content": "q"}])
    assert [body["model"] for _, _, body in gone.hits + live.hits] == ["policy-v3", "policy-v5"]
    assert (completion.policy_version, completion.version_source) == (5, "adapter")
    assert gone.paths() == ["/v1/chat/completions"]  # never the token route

    with InferenceClient([live.url], "m", version_source=lambda: 0, adapters=True) as client:
        (base,) = client.chat([{"role": "user", "content": "q"}])
    assert live.hits[-1][2]["model"] == "m"
    assert (base.policy_version, base.version_source) == (0, "adapter")


def test_lora_mode_gives_up_when_no_server_has_an_adapter(
    fake_servers: Callable[[], FakeServer],
) -> None:
    server = fake_servers()
    server.routes[("POST", "/v1/chat/completions")] = (404, {"error": "model does not exist"})
    with (
        InferenceClient(
            [server.url], "m", version_source=lambda: 7, adapters=True, attempts=2, backoff=0.0
        ) as client,
        pytest.raises(ServiceUnavailable, match="policy-v7"),
    ):
        client.chat([{"role": "user", "content": "q"}])
