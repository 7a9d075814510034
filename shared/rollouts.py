"""The rollout stream: graded groups, appended by workers and read by the learner.

An append is idempotent by group id: a redelivered grading finds the group's marker and adds
nothing. The marker and the XADD happen in one Lua script, so a worker killed between the two
cannot leave a marker without an entry (or the reverse).
"""

from __future__ import annotations

import redis

from shared import keys
from shared.messages import GradedGroup

SEEN_TTL_SECONDS = 14 * 24 * 3600
"""How long a group id is remembered after its append (longer than any redelivery)."""

_APPEND = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  return redis.call('XADD', KEYS[2], '*', 'group', ARGV[1])
end
return false
"""


def append_group(client: redis.Redis, group: GradedGroup) -> str | None:
    """Append `group` to its run's stream; returns the entry id, or None if already there."""
    script = client.register_script(_APPEND)
    entry = script(
        keys=[keys.group_seen(group.run, group.group_id), keys.rollout_stream(group.run)],
        args=[group.model_dump_json(), SEEN_TTL_SECONDS],
    )
    if entry is None:
        return None
    return entry.decode() if isinstance(entry, bytes) else str(entry)


def decode_entry(fields: dict[bytes, bytes]) -> GradedGroup:
    """The graded group of one stream entry (raises pydantic.ValidationError if malformed)."""
    return GradedGroup.model_validate_json(fields[b"group"])
