"""Multi-job groups tracked by an explicit record in Redis, with a deadline (not a chord): the
G candidates of one generation group, or the stages of one candidate (see `GroupTracker`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from shared import keys

PENDING = "pending"
TTL_SECONDS = 7 * 24 * 3600
"""How long a group's record is kept in Redis."""
_META = ("__deadline__", "__completed__")
EXPIRED = "expired"
"""The `__completed__` mark of a group closed by `expire`."""

_FINISH = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return -1 end
if current == 'pending' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local values = redis.call('HGETALL', KEYS[1])
for i = 1, #values, 2 do
  if values[i] ~= '__deadline__' and values[i] ~= '__completed__' and values[i + 1] == 'pending' then
    return 0
  end
end
if redis.call('HSETNX', KEYS[1], '__completed__', '1') == 1 then return 1 end
return 2
"""

_EXPIRE = """
if redis.call('HSETNX', KEYS[1], '__completed__', ARGV[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class GroupTracker:
    """The group records of one run.

    A group is a hash: one field per member (`pending`, or its JSON result once done).
    Finishing a member and checking for completion is one Lua script, so exactly one caller
    sees the group complete. A member killed past its retries is finished as failed by whoever
    handles its failure, so the group still completes. A group that cannot complete in time (a
    member lost with no failure to handle) is closed by `expire` once the deadline its sender
    keeps has passed: from then on no finish completes it, and a late `open` finds it closed.
    """

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.run = run
        self._finish = client.register_script(_FINISH)
        self._expire = client.register_script(_EXPIRE)

    def open(self, group_id: str, members: Sequence[str], ttl_seconds: int = TTL_SECONDS) -> None:
        """Create the record with every member pending (no-op if it exists, or was expired)."""
        key = keys.group_record(self.run, group_id)
        mapping: dict[str, str] = {member: PENDING for member in members}
        with self.client.pipeline() as pipe:
            pipe.watch(key)
            if pipe.exists(key):
                return
            pipe.multi()
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, ttl_seconds)
            pipe.execute()

    def finish(self, group_id: str, member: str, result: dict[str, Any]) -> bool:
        """Record a member's result (first one wins); True for the one call that completes the
        group."""
        status = self._finish(
            keys=[keys.group_record(self.run, group_id)], args=[member, json.dumps(result)]
        )
        return int(status) == 1

    def results(self, group_id: str) -> dict[str, dict[str, Any] | None]:
        """Each member's result (None while pending)."""
        raw = self.client.hgetall(keys.group_record(self.run, group_id))
        out: dict[str, dict[str, Any] | None] = {}
        for field, value in raw.items():
            name = field.decode()
            if name in _META:
                continue
            out[name] = None if value == PENDING.encode() else json.loads(value)
        return out

    def expire(self, group_id: str, ttl_seconds: int = TTL_SECONDS) -> bool:
        """Close the group for good (its sender's deadline passed): no finish completes it from
        now on, and `open` leaves it closed. True if this call closed it; False if it had
        completed already (whoever completed it is handling its result)."""
        closed = self._expire(
            keys=[keys.group_record(self.run, group_id)], args=[EXPIRED, ttl_seconds]
        )
        return int(closed) == 1

    def expired(self, group_id: str) -> bool:
        """Whether `expire` closed the group."""
        mark = self.client.hget(keys.group_record(self.run, group_id), "__completed__")
        return bool(mark == EXPIRED.encode())
