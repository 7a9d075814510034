"""Multi-job groups tracked by an explicit record in Redis, with a deadline (not a chord).

A group (the G candidates of one generation group, or the stages of one candidate) is a hash:
one field per member (`pending`, or its JSON result once done), plus the deadline. Finishing a
member and checking for completion is one Lua script, so exactly one caller sees the group
complete. A member lost or killed past its retries is finished as failed, either by whoever
handles its failure or, once the deadline passes, by `expire` for every member still pending:
the group always completes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis

from shared import keys

PENDING = "pending"
_META = ("__deadline__", "__completed__")

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


class GroupTracker:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.run = run
        self._finish = client.register_script(_FINISH)

    def open(
        self,
        group_id: str,
        members: Sequence[str],
        deadline_seconds: float,
        ttl_seconds: int = 7 * 24 * 3600,
    ) -> None:
        """Create the record with every member pending (no-op if it exists)."""
        key = keys.group_record(self.run, group_id)
        mapping: dict[str, str] = {member: PENDING for member in members}
        mapping["__deadline__"] = str(time.time() + deadline_seconds)
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

    def expire(self, group_id: str, now: float | None = None) -> bool:
        """Past the deadline, finish every pending member as failed; True if this completed it."""
        key = keys.group_record(self.run, group_id)
        deadline = self.client.hget(key, "__deadline__")
        if deadline is None or (now or time.time()) < float(deadline):
            return False
        completed = False
        for member, result in self.results(group_id).items():
            if result is None:
                failure = {"ok": False, "error": "deadline passed before the member finished"}
                completed = self.finish(group_id, member, failure) or completed
        return completed
