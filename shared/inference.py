"""A small client for the policy's vLLM servers: chat and plain completions, sync and async.

Every `Completion` carries what the trainer needs without re-tokenising, its policy version
included; the two routes to a server and the failure rules are `InferenceClient`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import structlog
from pydantic import BaseModel, ConfigDict

from shared.errors import EvoEnvError, ServiceUnavailable
from shared.policy import adapter_name

log = structlog.get_logger(__name__)

Json = dict[str, Any]
Messages = Sequence[dict[str, str]]
Route = Literal["tokens", "openai"]
VersionSource = Literal["server", "redis", "adapter", "none"]


class InferenceError(EvoEnvError):
    """The server answered, but refused the request or answered out of protocol (not retried)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    """A failed attempt worth trying again on the next server."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """How to sample one request. `json_schema` or `grammar` constrain the output."""

    max_tokens: int = 512
    """Most tokens to generate per completion."""
    temperature: float = 1.0
    """0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 is off."""
    top_k: int | None = None
    """Sample among the k likeliest tokens; None is off."""
    n: int = 1
    """Completions per request (one prompt, n samples)."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion (not included in the text)."""
    seed: int | None = None
    """Per-request sampling seed, for reproducible samples."""
    json_schema: dict[str, Any] | None = None
    """Constrain the output to JSON matching this schema (vLLM structured outputs)."""
    grammar: str | None = None
    """Constrain the output to this grammar (EBNF / Lark, as vLLM's structured outputs take)."""

    def fields(self) -> Json:
        """The sampling fields of an OpenAI-style request body."""
        body: Json = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
        }
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.stop:
            body["stop"] = list(self.stop)
        if self.seed is not None:
            body["seed"] = self.seed
        if self.json_schema is not None and self.grammar is not None:
            raise ValueError("give json_schema or grammar, not both")
        if self.json_schema is not None:
            body["structured_outputs"] = {"json": self.json_schema}
        elif self.grammar is not None:
            body["structured_outputs"] = {"grammar": self.grammar}
        return body


class Completion(BaseModel):
    """One sampled completion and everything the trainer needs to learn from it.

    The text, the prompt and completion token ids, the log-prob of each completion token under
    the distribution it was actually sampled from (the server runs with `--logprobs-mode
    processed_logprobs`, so temperature, top-p and top-k are accounted for), the finish reason
    and the policy version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    """The completion's token ids (including a final end-of-turn token when it stopped on it)."""
    logprobs: list[float]
    """One per completion token: its log-prob under the distribution it was sampled from
    (after temperature, top-p and top-k; at temperature 0, under the unscaled one)."""
    finish_reason: str
    """`stop` (end of turn or a stop string), `length` (max_tokens) or `abort`."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended it; None at end of turn or length."""
    policy_version: int
    """Version of the weights that sampled it (the oldest, should a push happen mid-way)."""
    version_source: VersionSource
    """Where the version came from: the server's per-token labels, Redis, the LoRA adapter the
    request asked for (`adapter`: its version, exactly), or neither (0)."""
    weight_versions: list[int] = []
    """The versions the server's spans name, in token order: two or more when a push came
    mid-way and the completion went on under the new weights (`keep` pauses); empty where the
    server labelled none."""
    server: str
    """The URL of the server that answered."""


# ---------------------------------------------------------------------------------------------
# Request bodies and response parsing: pure functions, shared by both clients.


def chat_body(model: str, messages: Messages, sampling: Sampling) -> Json:
    """Body of `/v1/chat/completions` (and its `/render`): token ids and sampled log-probs on."""
    return {
        "model": model,
        "messages": [dict(message) for message in messages],
        **sampling.fields(),
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }


def completion_body(model: str, prompt: str | Sequence[int], sampling: Sampling) -> Json:
    """Body of `/v1/completions` (and its `/render`) for one prompt, text or token ids."""
    return {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        **sampling.fields(),
        "logprobs": 0,
        "return_token_ids": True,
    }


def generate_body(rendered: Json | list[Json]) -> Json:
    """The `/inference/v1/generate` body from what a `/render` endpoint returned."""
    if isinstance(rendered, list):
        if len(rendered) != 1:
            raise InferenceError(f"render returned {len(rendered)} requests for one prompt")
        rendered = rendered[0]
    if not isinstance(rendered, dict) or "token_ids" not in rendered:
        raise InferenceError("render returned no token ids")
    return {**rendered, "output_mode": "text", "return_token_ids": True, "stream": False}


def _version_of(spans: Any) -> int | None:
    """The oldest weight version among a choice's spans, if the labels are policy versions."""
    if not spans:
        return None
    first = min(spans, key=lambda span: int(span["start"]))
    try:
        return int(first["version"])
    except (TypeError, ValueError):
        return None  # "default": never pushed since the server started


def _versions_of(spans: Any) -> list[int]:
    """The policy versions a choice's spans name, in token order; a span labelled otherwise
    ("default": never pushed since the server started) is left out."""
    versions = []
    for span in sorted(spans or [], key=lambda span: int(span["start"])):
        try:
            versions.append(int(span["version"]))
        except (TypeError, ValueError):
            continue
    return versions


def _checked(
    text: str | None,
    prompt_ids: Any,
    token_ids: Any,
    logprobs: list[float],
    choice: Json,
    server: str,
    version: tuple[int, VersionSource],
    weight_versions: list[int] | None = None,
) -> Completion:
    if not isinstance(prompt_ids, list) or not isinstance(token_ids, list):
        raise InferenceError(f"{server} returned no token ids (is return_token_ids supported?)")
    if len(logprobs) != len(token_ids):
        raise InferenceError(
            f"{server} returned {len(logprobs)} log-probs for {len(token_ids)} tokens"
        )
    return Completion(
        text=text or "",
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        stop_reason=choice.get("stop_reason"),
        policy_version=version[0],
        version_source=version[1],
        weight_versions=weight_versions or [],
        server=server,
    )


def _fallback(version: int | None) -> tuple[int, VersionSource]:
    return (0, "none") if version is None else (version, "redis")


def _content_logprobs(choice: Json) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [float(entry["logprob"]) for entry in content]


def parse_generate(body: Json, server: str, fallback: int | None) -> list[Completion]:
    """Completions from an `/inference/v1/generate` answer (output_mode `text`)."""
    out = []
    for choice in sorted(body.get("choices") or [], key=lambda c: int(c["index"])):
        exact = _version_of(choice.get("weight_versions"))
        version: tuple[int, VersionSource] = (
            (exact, "server") if exact is not None else _fallback(fallback)
        )
        out.append(
            _checked(
                choice.get("text"), body.get("prompt_token_ids"), choice.get("token_ids"),
                _content_logprobs(choice), choice, server, version,
                _versions_of(choice.get("weight_versions")),
            )
        )  # fmt: skip
    return _nonempty(out, server)


def parse_chat(body: Json, server: str, fallback: int | None) -> list[Completion]:
    """Completions from a `/v1/chat/completions` answer."""
    out = []
    for choice in sorted(body.get("choices") or [], key=lambda c: int(c["index"])):
        out.append(
            _checked(
                (choice.get("message") or {}).get("content"), body.get("prompt_token_ids"),
                choice.get("token_ids"), _content_logprobs(choice), choice, server,
                _fallback(fallback),
            )
        )  # fmt: skip
    return _nonempty(out, server)


def parse_completions(body: Json, server: str, fallback: int | None) -> list[Completion]:
    """Completions from a `/v1/completions` answer (one prompt)."""
    out = []
    for choice in sorted(body.get("choices") or [], key=lambda c: int(c["index"])):
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        out.append(
            _checked(
                choice.get("text"), choice.get("prompt_token_ids"), choice.get("token_ids"),
                [float(x) for x in logprobs], choice, server, _fallback(fallback),
            )
        )  # fmt: skip
    return _nonempty(out, server)


def _nonempty(out: list[Completion], server: str) -> list[Completion]:
    if not out:
        raise InferenceError(f"{server} returned no choices")
    return out


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise InferenceError(
            f"{response.request.url} answered {response.status_code} with a body that is not JSON"
        ) from exc


def _status(response: httpx.Response) -> None:
    """The status check of every call: 200 passes, 5xx is retried, anything else raises."""
    if response.status_code == 200:
        return
    detail = response.text[:500]
    where = f"{response.request.method} {response.request.url}"
    if response.status_code >= 500:
        raise _Retryable(f"{where} answered {response.status_code}: {detail}")
    raise InferenceError(f"{where} answered {response.status_code}: {detail}", response.status_code)


def _no_tokens_route(response: httpx.Response) -> bool:
    """The server has no token route: scale-out disabled (403) or no such endpoint (404)."""
    if response.status_code == 403:
        return True
    if response.status_code == 404:
        try:
            return bool(response.json().get("detail") == "Not Found")
        except ValueError:
            return True
    return False


def _adapter_body(body: Json, base: str, version: int | None) -> Json:
    """LoRA mode: the request asks for the adapter of `version` (the base model at version 0,
    before any push)."""
    return {**body, "model": adapter_name(version) if version else base}


def _adapter_status(response: httpx.Response, model: str) -> None:
    """LoRA mode's status check: a 404 means the adapter asked for is not (or no longer)
    loaded on that server (unloaded as too stale, or the server restarted and the learner has
    not loaded it again yet): retried, asking for the newest version then."""
    if response.status_code == 404:
        raise _Retryable(f"{response.request.url} does not serve {model} (404)")
    _status(response)


def _as_adapter(completions: list[Completion], version: int | None) -> list[Completion]:
    """LoRA mode: each completion's version is the adapter's it asked for."""
    update = {"policy_version": version or 0, "version_source": "adapter", "weight_versions": []}
    return [c.model_copy(update=update) for c in completions]


@dataclass
class _Balancer:
    """Spreads requests across servers and remembers which route each one supports."""

    urls: list[str]
    attempts: int
    backoff: float
    routes: dict[str, Route] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("no vLLM server URLs")
        self.urls = [url.rstrip("/") for url in self.urls]
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")

    def plan(self) -> list[str]:
        """The server of each attempt: round robin from a rotating start."""
        start = next(self._counter) % len(self.urls)
        order = self.urls[start:] + self.urls[:start]
        return [order[i % len(order)] for i in range(self.attempts)]

    def delay(self, attempt: int) -> float:
        """Backoff before attempt `attempt` (1-based past the first): doubling, jittered."""
        return float(min(self.backoff * 2 ** (attempt - 1), 10.0) * (0.5 + random.random() / 2))

    def route(self, url: str) -> Route:
        return self.routes.get(url, "tokens")

    def give_up(self, failures: list[str]) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"no vLLM server answered after {len(failures)} attempts: " + "; ".join(failures)
        )


def bearer(api_key: str) -> dict[str, str]:
    """The headers that carry a model server's token (`serve.api_key`; none when empty)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _timeout(request_timeout: float, connect_timeout: float) -> httpx.Timeout:
    return httpx.Timeout(request_timeout, connect=connect_timeout, pool=request_timeout)


POLL_SECONDS = 0.5
"""How often a request timed on a serving clock looks at the clock."""
OUTAGE_POLL_SECONDS = 1.0
"""How often a request whose servers all refused it asks them for /health."""


def _within(
    calls: concurrent.futures.Executor,
    call: Callable[[], httpx.Response],
    clock: Callable[[], float],
    limit: float,
) -> httpx.Response:
    """`call()` (run in `calls`), given `limit` seconds of `clock`; `httpx.ReadTimeout` past them
    (the request is abandoned: it ends at the client's wall timeout)."""
    future = calls.submit(call)
    start = clock()
    while True:
        try:
            return future.result(timeout=POLL_SECONDS)
        except concurrent.futures.TimeoutError:
            if clock() - start > limit:
                future.cancel()
                raise httpx.ReadTimeout(
                    f"no answer within {limit:g} s of generation (paused seconds left out)"
                ) from None


# ---------------------------------------------------------------------------------------------
# The clients.


class InferenceClient:
    """Synchronous client (Celery workers, scripts). Use as a context manager, or `close()`.

    Two routes to a server, chosen per server (both clients):

    - Token route (servers started by `evoenv serve`, i.e. with `--enable-scale-out`): render
      the request to token ids (`/v1/chat/completions/render`, `/v1/completions/render`), then
      `/inference/v1/generate`, whose choices report the weight version that sampled every
      token. A completion takes the oldest of them: an exact version.
    - OpenAI route (any other vLLM server): `/v1/chat/completions` or `/v1/completions` with
      `return_token_ids` and `logprobs`; the policy version is the one `version_source`
      (Redis) gave just before the request, so a request queued during a weight push is tagged
      one version old, which only errs towards calling it stale.
    - LoRA mode (`adapters=True`, the policy trained as a LoRA adapter): the OpenAI route,
      asking for the newest version's adapter by name (`adapter_name`, the version read from
      `version_source` just before); the completion's version is that adapter's. A server
      that does not serve it (404: unloaded as too stale, or restarted and not loaded yet) is
      retried like a failed one, asking for the newest version again.

    Failures: a connection error, a timeout or a 5xx answer is retried with backoff on the next
    server, at most `attempts` times in all, then raised as `ServiceUnavailable`; where the last
    attempt found no server listening, the request first waits up to `outage_wait` seconds for
    one to answer /health and, if one does, is tried `attempts` times again. With a
    `serving_clock` (the workers': `shared.pauses.ServingClock`), a request's timeout counts
    seconds on that clock, so the seconds the servers spend paused by a push or a training step
    do not count, and `wall_timeout` bounds it on the wall clock. Any other answer that is not
    200 raises `InferenceError` at once (the request itself is wrong: a prompt longer than the
    context, an unknown model name).
    """

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        *,
        version_source: Callable[[], int] | None = None,
        request_timeout: float = 600.0,
        connect_timeout: float = 5.0,
        attempts: int = 4,
        backoff: float = 0.5,
        serving_clock: Callable[[], float] | None = None,
        wall_timeout: float | None = None,
        adapters: bool = False,
        api_key: str = "",
        outage_wait: float = 0.0,
    ) -> None:
        """`request_timeout`: seconds a request may wait for its answer, on `serving_clock` if
        one is given (seconds the servers are paused left out), else on the wall clock;
        `wall_timeout` (with a clock): the most wall seconds it may take all the same;
        `api_key`: the servers' bearer token (`serve.api_key`), sent with every request;
        `outage_wait`: seconds a request whose every attempt found no server listening waits
        for one to come back (a restart), and is sent again the moment one does."""
        self.model = model
        self.outage_wait = outage_wait
        self.version_source = version_source
        self.adapters = adapters
        self._balancer = _Balancer(list(urls), attempts, backoff)
        self.request_timeout = request_timeout
        self.serving_clock = serving_clock
        wall = wall_timeout if serving_clock is not None and wall_timeout else request_timeout
        self._http = httpx.Client(
            timeout=_timeout(max(wall, request_timeout), connect_timeout),
            headers=bearer(api_key),
        )
        self._calls = (
            concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="inference")
            if serving_clock is not None
            else None
        )

    @property
    def urls(self) -> list[str]:
        return list(self._balancer.urls)

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._calls is not None:
            self._calls.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def _post(self, url: str, body: Json) -> httpx.Response:
        """POST `body`, timed on the serving clock where there is one."""
        if self._calls is None or self.serving_clock is None:
            return self._http.post(url, json=body)
        return _within(
            self._calls,
            lambda: self._http.post(url, json=body),
            self.serving_clock,
            self.request_timeout,
        )

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until every server answers /health with 200; `ServiceUnavailable` after `timeout`."""
        deadline = time.monotonic() + timeout
        for url in self._balancer.urls:
            while not self._healthy(url):
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"{url} was not healthy after {timeout:.0f} s")
                time.sleep(0.5)

    def chat(self, messages: Messages, sampling: Sampling | None = None) -> list[Completion]:
        """Sample `sampling.n` assistant replies to `messages` (chat template applied)."""
        body = chat_body(self.model, messages, sampling or Sampling())
        return self._run(body, "/v1/chat/completions", parse_chat)

    def complete(
        self, prompt: str | Sequence[int], sampling: Sampling | None = None
    ) -> list[Completion]:
        """Sample `sampling.n` continuations of a raw prompt (text or token ids)."""
        body = completion_body(self.model, prompt, sampling or Sampling())
        return self._run(body, "/v1/completions", parse_completions)

    def _run(
        self, body: Json, path: str, parse: Callable[[Json, str, int | None], list[Completion]]
    ) -> list[Completion]:
        failures: list[str] = []
        outage_ends: float | None = None  # the wait's budget starts with the outage
        while True:
            refused = False
            for attempt, url in enumerate(self._balancer.plan()):
                if attempt:
                    time.sleep(self._balancer.delay(attempt))
                try:
                    return self._once(url, body, path, parse)
                except (httpx.TransportError, _Retryable) as exc:
                    failures.append(f"{url}: {str(exc) or type(exc).__name__}")
                    refused = isinstance(exc, httpx.ConnectError)
            if not refused or self.outage_wait <= 0:
                raise self._balancer.give_up(failures)
            if outage_ends is None:
                outage_ends = time.monotonic() + self.outage_wait
            if not self._server_back(outage_ends):
                gone = self._balancer.give_up(failures)
                raise ServiceUnavailable(f"{gone}; none came back within {self.outage_wait:g} s")

    def _once(
        self,
        url: str,
        body: Json,
        path: str,
        parse: Callable[[Json, str, int | None], list[Completion]],
    ) -> list[Completion]:
        version = self.version_source() if self.version_source else None
        if self.adapters:
            asked = _adapter_body(body, self.model, version)
            response = self._post(f"{url}{path}", asked)
            _adapter_status(response, asked["model"])
            return _as_adapter(parse(_json(response), url, version), version)
        if self._balancer.route(url) == "tokens":
            result = self._via_tokens(url, path, body, version)
            if result is not None:
                return result
        response = self._post(f"{url}{path}", body)
        _status(response)
        return parse(_json(response), url, version)

    def _healthy(self, url: str) -> bool:
        """Whether `url` answers /health with 200 now."""
        try:
            return self._http.get(f"{url}/health", timeout=5.0).status_code == 200
        except httpx.TransportError:
            return False

    def _server_back(self, until: float) -> bool:
        """After every attempt found no server listening (one restarting): wait, until the
        monotonic time `until`, for one to answer /health, so that the request is sent again
        the moment it is back rather than after a job retry's backoff."""
        start = time.monotonic()
        while time.monotonic() < until:
            for url in self._balancer.urls:
                if self._healthy(url):
                    waited = round(time.monotonic() - start, 1)
                    log.info("inference_server_back", url=url, waited_s=waited)
                    return True
            time.sleep(min(OUTAGE_POLL_SECONDS, max(0.0, until - time.monotonic())))
        return False

    def _via_tokens(
        self, url: str, path: str, body: Json, version: int | None
    ) -> list[Completion] | None:
        """Render then generate; None (and the OpenAI route from now on) if unsupported."""
        rendered = self._http.post(f"{url}{path}/render", json=body)
        if _no_tokens_route(rendered):
            self._balancer.routes[url] = "openai"
            return None
        _status(rendered)
        response = self._post(f"{url}/inference/v1/generate", generate_body(_json(rendered)))
        _status(response)
        return parse_generate(_json(response), url, version)


class AsyncInferenceClient:
    """Asynchronous client (the learner's evaluation, many requests in flight); routes and
    failures as `InferenceClient`'s."""

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        *,
        version_source: Callable[[], Awaitable[int]] | None = None,
        request_timeout: float = 600.0,
        connect_timeout: float = 5.0,
        attempts: int = 4,
        backoff: float = 0.5,
        adapters: bool = False,
        api_key: str = "",
    ) -> None:
        self.model = model
        self.version_source = version_source
        self.adapters = adapters
        self._balancer = _Balancer(list(urls), attempts, backoff)
        self._http = httpx.AsyncClient(
            timeout=_timeout(request_timeout, connect_timeout), headers=bearer(api_key)
        )

    @property
    def urls(self) -> list[str]:
        return list(self._balancer.urls)

    async def __aenter__(self) -> AsyncInferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def wait_ready(self, timeout: float = 300.0) -> None:
        """Wait until every server answers /health with 200; `ServiceUnavailable` after `timeout`."""
        deadline = time.monotonic() + timeout
        for url in self._balancer.urls:
            while True:
                try:
                    if (await self._http.get(f"{url}/health", timeout=5.0)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"{url} was not healthy after {timeout:.0f} s")
                await asyncio.sleep(0.5)

    async def chat(self, messages: Messages, sampling: Sampling | None = None) -> list[Completion]:
        """Sample `sampling.n` assistant replies to `messages` (chat template applied)."""
        body = chat_body(self.model, messages, sampling or Sampling())
        return await self._run(body, "/v1/chat/completions", parse_chat)

    async def complete(
        self, prompt: str | Sequence[int], sampling: Sampling | None = None
    ) -> list[Completion]:
        """Sample `sampling.n` continuations of a raw prompt (text or token ids)."""
        body = completion_body(self.model, prompt, sampling or Sampling())
        return await self._run(body, "/v1/completions", parse_completions)

    async def _run(
        self, body: Json, path: str, parse: Callable[[Json, str, int | None], list[Completion]]
    ) -> list[Completion]:
        failures: list[str] = []
        for attempt, url in enumerate(self._balancer.plan()):
            if attempt:
                await asyncio.sleep(self._balancer.delay(attempt))
            try:
                version = await self.version_source() if self.version_source else None
                if self.adapters:
                    asked = _adapter_body(body, self.model, version)
                    response = await self._http.post(f"{url}{path}", json=asked)
                    _adapter_status(response, asked["model"])
                    return _as_adapter(parse(_json(response), url, version), version)
                if self._balancer.route(url) == "tokens":
                    result = await self._via_tokens(url, path, body, version)
                    if result is not None:
                        return result
                response = await self._http.post(f"{url}{path}", json=body)
                _status(response)
                return parse(_json(response), url, version)
            except (httpx.TransportError, _Retryable) as exc:
                failures.append(f"{url}: {str(exc) or type(exc).__name__}")
        raise self._balancer.give_up(failures)

    async def _via_tokens(
        self, url: str, path: str, body: Json, version: int | None
    ) -> list[Completion] | None:
        """Render then generate; None (and the OpenAI route from now on) if unsupported."""
        rendered = await self._http.post(f"{url}{path}/render", json=body)
        if _no_tokens_route(rendered):
            self._balancer.routes[url] = "openai"
            return None
        _status(rendered)
        response = await self._http.post(
            f"{url}/inference/v1/generate", json=generate_body(_json(rendered))
        )
        _status(response)
        return parse_generate(_json(response), url, version)
