"""What a worker process holds: its settings and, created lazily per process, one sandbox, one
Redis client and one archive engine. Installed by `app.configure` in the entry point; reset in
each forked pool process (sockets and the sandbox are never shared across a fork)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.config import Settings
from shared.errors import EvoEnvError

if TYPE_CHECKING:
    import redis

    from evoenv_worker.novelty import Embedder
    from evoenv_worker.sandbox.host import Sandbox
    from shared.db import Archive
    from shared.inference import InferenceClient


@dataclass
class WorkerContext:
    settings: Settings
    _sandbox: Sandbox | None = None
    _redis: redis.Redis | None = None
    _archive: Archive | None = None
    _inference: InferenceClient | None = None
    _reviewer: InferenceClient | None = None
    _embedder: Embedder | None = None
    _stream_key: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sandbox(self) -> Sandbox:
        """This process's sandbox (one request at a time; it serialises callers)."""
        with self._lock:
            if self._sandbox is None:
                from evoenv_worker.sandbox.host import Sandbox

                self._sandbox = Sandbox(self.settings.sandbox)
            return self._sandbox

    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                from shared.redis_client import connect

                self._redis = connect(self.settings)
            return self._redis

    def stream_key(self) -> bytes:
        """The key this worker signs rollout stream entries with (`shared/stream_key.py`)."""
        with self._lock:
            if self._stream_key is None:
                from shared.stream_key import stream_key

                self._stream_key = stream_key(self.settings)
            return self._stream_key

    def archive(self) -> Archive:
        with self._lock:
            if self._archive is None:
                from shared.db import Archive

                self._archive = Archive(self.settings.archive_url)
            return self._archive

    def inference(self) -> InferenceClient:
        """This process's client for the policy's vLLM servers (thread-safe); its requests'
        timeouts leave out the seconds the servers spend paused."""
        store = self.redis()
        with self._lock:
            if self._inference is None:
                from evoenv_worker.solver_completions import make_client
                from shared.pauses import ServingClock
                from shared.policy import read_version

                self._inference = make_client(
                    self.settings, lambda: read_version(store), ServingClock(store)
                )
            return self._inference

    def reviewer(self) -> InferenceClient:
        """The reviewer's client: the policy's servers unless another endpoint is configured."""
        a = self.settings.admission
        if not a.reviewer_url:
            return self.inference()
        with self._lock:
            if self._reviewer is None:
                from shared.inference import InferenceClient

                self._reviewer = InferenceClient(
                    [a.reviewer_url],
                    a.reviewer_model or self.settings.model,
                    connect_timeout=self.settings.worker.connect_timeout,
                    api_key=a.reviewer_api_key.get_secret_value(),
                )
            return self._reviewer

    def embedder(self) -> Embedder:
        """The novelty embedder (all-MiniLM-L6-v2), loaded once per process on first use."""
        with self._lock:
            if self._embedder is None:
                from evoenv_worker.novelty import Embedder

                self._embedder = Embedder()
            return self._embedder

    def close(self) -> None:
        with self._lock:
            if self._reviewer is not None:
                self._reviewer.close()
            if self._inference is not None:
                self._inference.close()
            if self._sandbox is not None:
                self._sandbox.close()
            if self._redis is not None:
                self._redis.close()
            if self._archive is not None:
                self._archive.engine.dispose()
            self._sandbox = self._redis = self._archive = self._inference = self._reviewer = None


_current: WorkerContext | None = None


def install(settings: Settings) -> WorkerContext:
    global _current
    if _current is not None:
        _current.close()
    _current = WorkerContext(settings)
    return _current


def current() -> WorkerContext:
    if _current is None:
        raise EvoEnvError(
            "the worker is not configured: call evoenv_worker.app.configure(settings)"
        )
    return _current


def settings() -> Settings:
    return current().settings if _current is not None else Settings()


def after_fork() -> None:
    """In a fresh pool process: forget the parent's connections and sandbox (do not close them:
    they belong to the parent)."""
    if _current is not None:
        _current._sandbox = None
        _current._redis = None
        if _current._archive is not None:
            _current._archive.engine.dispose(close=False)
        _current._archive = None
        _current._inference = None
        _current._reviewer = None


def close() -> None:
    if _current is not None:
        _current.close()
