"""Seconds the model servers spent paused, so that deadlines can leave them out.

The publisher records every pause of the servers (a push, a training step taken in turns) in
Redis: the total of the pauses that ended and the start of the one in progress. Wall-clock
seconds (`time.time()`), so that every process on every host reads the same clock.
"""

from __future__ import annotations

import time
from typing import Any

import redis
import structlog

from shared import keys

log = structlog.get_logger(__name__)

_END = """
local since = redis.call('GET', KEYS[2])
if since then
  local spent = tonumber(ARGV[1]) - tonumber(since)
  if spent > 0 then redis.call('INCRBYFLOAT', KEYS[1], spent) end
  redis.call('DEL', KEYS[2])
end
return 1
"""


def _float(raw: Any) -> float:
    return float(raw.decode() if isinstance(raw, bytes) else raw) if raw is not None else 0.0


def began(client: redis.Redis) -> None:
    """The servers are paused from now (a pause already in progress keeps its start)."""
    try:
        client.set(keys.PAUSED_SINCE, repr(time.time()), nx=True)
    except redis.RedisError as exc:  # a deadline then counts this pause: never worse than before
        log.warning("pause_not_recorded", error=str(exc))


def ended(client: redis.Redis) -> None:
    """The servers generate again: the pause's seconds join the total."""
    try:
        client.eval(_END, 2, keys.PAUSED_SECONDS, keys.PAUSED_SINCE, repr(time.time()))
    except redis.RedisError as exc:
        log.warning("pause_not_recorded", error=str(exc))


def paused_seconds(client: redis.Redis) -> float:
    """Every second the servers have spent paused, the pause in progress included."""
    total, since = client.mget(keys.PAUSED_SECONDS, keys.PAUSED_SINCE)
    now = time.time()
    return _float(total) + (max(0.0, now - _float(since)) if since is not None else 0.0)


class ServingClock:
    """A clock in seconds that stands still while the servers are paused, so that a deadline
    measured on it does not run out because completions were frozen. Where Redis does not
    answer it goes on with the paused seconds it last read (it never jumps forward)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._paused = 0.0

    def __call__(self) -> float:
        try:
            self._paused = max(self._paused, paused_seconds(self.client))
        except redis.RedisError:
            pass
        return time.time() - self._paused
