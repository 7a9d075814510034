"""Sample instances for `evoenv pool serve`: an environment's description and one instance with
its reference answer, computed in a pool of sandboxes of their own, identical requests in
flight sharing one computation, and kept in an LRU cache."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.errors import SandboxUnavailable

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Described:
    """An environment's class attributes, as its `describe` op gave them (`error`: it failed)."""

    name: str = ""
    description: str = ""
    oracle: str = ""
    min_difficulty: int | None = None
    max_difficulty: int | None = None
    error: str = ""

    def clamp(self, difficulty: int | None, preferred: int | None) -> int | None:
        """`difficulty` (else `preferred`, else the middle) clamped to the range; None when the
        environment gave no integer range."""
        lo, hi = self.min_difficulty, self.max_difficulty
        if lo is None or hi is None or lo > hi:
            return None
        wanted = difficulty if difficulty is not None else preferred
        return (lo + hi) // 2 if wanted is None else min(max(wanted, lo), hi)


@dataclass(frozen=True)
class Sample:
    """One instance: the rendered prompt, the reference (JSON) and its answer text, each cut to
    the text limit; or why it could not be computed."""

    seed: int
    difficulty: int
    prompt: str = ""
    reference: str = ""
    answer_text: str = ""
    error: str = ""


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying so when it was longer."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({len(text):,} characters; the first {limit:,} shown)"


class Sampler:
    """The sandboxes of one web app, its caches and the computations in flight.

    Sampling runs on its own pool of `pool_web.sample_workers` threads, each with a sandbox of
    its own (started when first needed), never on the threads that serve the pages; every op
    has the settings' op time limit. An environment is computed in one sandbox at a time, so
    one that hangs holds one and the others keep sampling. Identical requests in flight share
    one computation, which runs to its end whoever leaves. Results, failures of the
    environment included, are cached by (sha, seed, difficulty), descriptions by sha; a
    failure of the sandbox itself (`SandboxUnavailable`, `SandboxFailure`) reaches every
    request that shared it and is not cached. The async methods run on the app's loop.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.sandbox
        self.op_seconds = settings.sandbox.op_seconds
        self.limit = settings.pool_web.sample_chars
        self.size = settings.pool_web.sample_cache
        self.computed = 0
        """Sandbox requests made (cache misses), for the tests and the log."""
        self._samples: OrderedDict[tuple[str, int, int], Sample] = OrderedDict()
        self._described: OrderedDict[str, Described] = OrderedDict()
        self._flights: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        self._turns: dict[str, _Turn] = {}
        self._executor = ThreadPoolExecutor(
            settings.pool_web.sample_workers, thread_name_prefix="pool-web-sample"
        )
        self._sandboxes: list[Sandbox] = []
        self._idle: list[Sandbox] = []
        self._closed = False
        self._lock = threading.Lock()
        """Guards the caches, the sandboxes and `computed` (the pool's threads touch them)."""

    @property
    def isolated(self) -> bool:
        """False once a sandbox started unconfined."""
        with self._lock:
            return all(sandbox.isolated for sandbox in self._sandboxes)

    def described(self, sha: str) -> Described | None:
        """The description of `sha` if one is cached; computes nothing."""
        return self._get(self._described, sha)

    async def describe(self, sha: str, source: str) -> Described:
        return await self._shared(
            self._described, sha, ("describe", sha), sha, lambda box: self._describe(box, source)
        )

    async def sample(self, sha: str, source: str, seed: int, difficulty: int) -> Sample:
        key = (sha, seed, difficulty)
        return await self._shared(
            self._samples,
            key,
            ("sample", *key),
            sha,
            lambda box: self._sample(box, sha, source, seed, difficulty),
        )

    def close(self) -> None:
        """Drop the computations not started and stop every sandbox (each once its op ends)."""
        with self._lock:
            self._closed = True
            sandboxes = list(self._sandboxes)
        self._executor.shutdown(wait=False, cancel_futures=True)
        for sandbox in sandboxes:
            sandbox.close()

    # ------------------------------------------------------------------ on the app's event loop

    async def _shared(
        self,
        cache: OrderedDict[Any, T],
        key: Any,
        flight_key: tuple[Any, ...],
        sha: str,
        work: Callable[[Sandbox], T],
    ) -> T:
        """The cached value of `key`, else the result of the computation of `flight_key` in
        flight, else of one started now (a caller that leaves does not cancel it)."""
        kept = self._get(cache, key)
        if kept is not None:
            return kept
        flight = self._flights.get(flight_key)
        if flight is None:
            flight = asyncio.ensure_future(self._compute(cache, key, sha, work))
            flight.add_done_callback(lambda done: self._landed(flight_key, done))
            self._flights[flight_key] = flight
        result: T = await asyncio.shield(flight)
        return result

    async def _compute(
        self,
        cache: OrderedDict[Any, T],
        key: Any,
        sha: str,
        work: Callable[[Sandbox], T],
    ) -> T:
        async with self._turn(sha):
            loop = asyncio.get_running_loop()
            value = await loop.run_in_executor(self._executor, self._in_sandbox, work)
        self._put(cache, key, value)
        return value

    def _landed(self, flight_key: tuple[Any, ...], flight: asyncio.Future[Any]) -> None:
        """Forget the computation `flight`, done; retrieve its exception, which its callers
        have had (asyncio would log it as never retrieved when they all left)."""
        del self._flights[flight_key]
        if not flight.cancelled():
            flight.exception()

    @asynccontextmanager
    async def _turn(self, sha: str) -> AsyncIterator[None]:
        """Wait for the environment `sha`'s turn: one computation of an environment at a time."""
        turn = self._turns.setdefault(sha, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[sha]

    # ------------------------------------------------------------------- on the pool's threads

    def _in_sandbox(self, work: Callable[[Sandbox], T]) -> T:
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("the web app is stopping")
            if self._idle:
                sandbox = self._idle.pop()
            else:
                sandbox = Sandbox(self.settings)
                self._sandboxes.append(sandbox)
            self.computed += 1
        try:
            return work(sandbox)
        finally:
            with self._lock:
                self._idle.append(sandbox)

    def _describe(self, sandbox: Sandbox, source: str) -> Described:
        (result,) = sandbox.run(source, [{"op": "describe"}], op_seconds=self.op_seconds)
        if not result.ok:
            return Described(error=truncate(result.reason, self.limit))
        value = result.value
        return Described(
            name=truncate(str(value.get("name")), self.limit),
            description=truncate(str(value.get("description")), self.limit),
            oracle=truncate(str(value.get("oracle")), self.limit),
            min_difficulty=_integer(value.get("min_difficulty")),
            max_difficulty=_integer(value.get("max_difficulty")),
        )

    def _sample(
        self, sandbox: Sandbox, sha: str, source: str, seed: int, difficulty: int
    ) -> Sample:
        op = {"op": "instance", "seed": seed, "difficulty": difficulty}
        (result,) = sandbox.run(source, [op], op_seconds=self.op_seconds)
        log.info("pool_web_sampled", env_sha=sha, seed=seed, difficulty=difficulty, ok=result.ok)
        if not result.ok:
            return Sample(seed, difficulty, error=truncate(result.reason, self.limit))
        value = result.value
        return Sample(
            seed,
            difficulty,
            prompt=truncate(str(value["prompt"]), self.limit),
            reference=truncate(_json(value["reference"]), self.limit),
            answer_text=truncate(str(value["answer_text"]), self.limit),
        )

    def _get(self, cache: OrderedDict[Any, T], key: Any) -> T | None:
        with self._lock:
            found = cache.get(key)
            if found is not None:
                cache.move_to_end(key)
            return found

    def _put(self, cache: OrderedDict[Any, T], key: Any, value: T) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self.size:
                cache.popitem(last=False)


@dataclass(eq=False)
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
