"""One way to connect to Redis: explicit timeouts, and a clear error when it is unreachable."""

from __future__ import annotations

import redis

from shared.config import Settings, mask_url
from shared.errors import ServiceUnavailable


def connect(settings: Settings, *, check: bool = False) -> redis.Redis:
    """A client for `settings.redis_url`; with `check`, ping it first (raise if unreachable)."""
    timeout = settings.worker.connect_timeout
    client = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=timeout,
        socket_timeout=max(timeout, 30.0),
        health_check_interval=30,
        decode_responses=False,
    )
    if check:
        ping(client, settings.redis_url)
    return client


def ping(client: redis.Redis, url: str) -> None:
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise ServiceUnavailable(f"cannot reach Redis at {mask_url(url)}: {exc}") from exc
