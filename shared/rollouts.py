"""The rollout stream: graded groups, appended by workers and read by the learner.

An append is idempotent by group id: a redelivered grading finds the group's marker and adds
nothing. The marker and the XADD happen in one Lua script, so a worker killed between the two
cannot leave a marker without an entry (or the reverse).
"""

from __future__ import annotations

import json

import redis
from pydantic import ValidationError

from shared import keys
from shared.errors import SchemaMismatch
from shared.messages import GradedGroup, version_problem

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
    """The graded group of one stream entry. Raises `SchemaMismatch` for an entry of a schema
    version this code does not read, pydantic.ValidationError for another malformed one, and
    KeyError for an entry with no group."""
    raw = fields[b"group"]
    try:
        return GradedGroup.model_validate_json(raw)
    except ValidationError as exc:
        version = written_version(raw)
        problem = None if version is None else version_problem(version)
        if problem is not None:
            raise SchemaMismatch(f"stream entry {problem}") from exc
        raise


def written_version(raw: bytes) -> object:
    """The schema version an entry says it was written with (None: it says none)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry.get("schema_version") if isinstance(entry, dict) else None
