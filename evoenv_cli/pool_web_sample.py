"""Sample instances for `evoenv pool serve`: an environment's description and one instance with
its reference answer, computed in the project's sandbox, bounded, and kept in an LRU cache."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import structlog

from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings

log = structlog.get_logger(__name__)


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
    """The sandbox of one web app and its caches. The sandbox starts on the first sample and
    runs one request at a time; every op has the settings' op time limit. Results, failures of
    the environment included, are cached by (sha, seed, difficulty), descriptions by sha; a
    failure of the sandbox itself (`SandboxUnavailable`, `SandboxFailure`) propagates and is
    not cached."""

    def __init__(self, settings: Settings) -> None:
        self.sandbox = Sandbox(settings.sandbox)
        self.op_seconds = settings.sandbox.op_seconds
        self.limit = settings.pool_web.sample_chars
        self.size = settings.pool_web.sample_cache
        self.computed = 0
        """Sandbox requests made (cache misses), for the tests and the log."""
        self._samples: OrderedDict[tuple[str, int, int], Sample] = OrderedDict()
        self._described: OrderedDict[str, Described] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def isolated(self) -> bool:
        return self.sandbox.isolated

    def describe(self, sha: str, source: str) -> Described:
        kept = self._get(self._described, sha)
        if kept is not None:
            return kept
        (result,) = self._run(source, {"op": "describe"})
        if not result.ok:
            described = Described(error=truncate(result.reason, self.limit))
        else:
            value = result.value
            described = Described(
                name=truncate(str(value.get("name")), self.limit),
                description=truncate(str(value.get("description")), self.limit),
                oracle=truncate(str(value.get("oracle")), self.limit),
                min_difficulty=_integer(value.get("min_difficulty")),
                max_difficulty=_integer(value.get("max_difficulty")),
            )
        self._put(self._described, sha, described)
        return described

    def sample(self, sha: str, source: str, seed: int, difficulty: int) -> Sample:
        key = (sha, seed, difficulty)
        kept = self._get(self._samples, key)
        if kept is not None:
            return kept
        op = {"op": "instance", "seed": seed, "difficulty": difficulty}
        (result,) = self._run(source, op)
        if not result.ok:
            sample = Sample(seed, difficulty, error=truncate(result.reason, self.limit))
        else:
            value = result.value
            sample = Sample(
                seed,
                difficulty,
                prompt=truncate(str(value["prompt"]), self.limit),
                reference=truncate(_json(value["reference"]), self.limit),
                answer_text=truncate(str(value["answer_text"]), self.limit),
            )
        self._put(self._samples, key, sample)
        log.info("pool_web_sampled", env_sha=sha, seed=seed, difficulty=difficulty, ok=result.ok)
        return sample

    def close(self) -> None:
        self.sandbox.close()

    def _run(self, source: str, op: dict[str, Any]) -> Any:
        self.computed += 1
        return self.sandbox.run(source, [op], op_seconds=self.op_seconds)

    def _get(self, cache: OrderedDict[Any, Any], key: Any) -> Any:
        with self._lock:
            found = cache.get(key)
            if found is not None:
                cache.move_to_end(key)
            return found

    def _put(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        with self._lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > self.size:
                cache.popitem(last=False)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
