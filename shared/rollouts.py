"""The rollout stream: graded groups, appended and signed by workers, read by the learner.

An append is idempotent by group id (a marker and the XADD in one Lua script); each entry
carries an HMAC of its group's JSON under the workers' and learner's shared key
(`shared/stream_key.py`), which the learner checks with its rewards' ranges (`EntryCheck`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass

import redis
from pydantic import ValidationError

from shared import keys
from shared.config import Settings
from shared.errors import SchemaMismatch
from shared.messages import GradedGroup, version_problem
from shared.rewards import SOLVER_BOUNDS, generator_bounds
from shared.stream_key import key_id, stream_key

SEEN_TTL_SECONDS = 14 * 24 * 3600
"""How long a group id is remembered after its append (longer than any redelivery)."""

_APPEND = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  return redis.call('XADD', KEYS[2], '*', 'group', ARGV[1], 'sig', ARGV[3], 'key_id', ARGV[4])
end
return false
"""


def append_group(client: redis.Redis, group: GradedGroup, key: bytes) -> str | None:
    """Append `group` to its run's stream, signed with `key` (`sign`); returns the entry id, or
    None if already there."""
    stream = keys.rollout_stream(group.run)
    raw = group.model_dump_json().encode()
    script = client.register_script(_APPEND)
    entry = script(
        keys=[keys.group_seen(group.run, group.group_id), stream],
        args=[raw, SEEN_TTL_SECONDS, sign(key, stream, raw), key_id(key)],
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


def sign(key: bytes, stream: str, raw: bytes) -> str:
    """The signature of an entry of `stream` whose group is the JSON `raw`, byte for byte as
    stored: HMAC-SHA256 under `key`, in hex. It covers the stream's name, so an entry copied
    to another run's stream does not verify there."""
    message = f"{len(stream)}:{stream}".encode() + raw
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class EntryCheck:
    """What the learner checks of a stream entry before it reads it: a worker's signature over
    the whole group (`forged`), then each reward within its role's range (`out_of_range`)."""

    key: bytes
    bounds: Mapping[str, tuple[float, float]]
    """The lowest and highest reward of each role."""

    @classmethod
    def of(cls, settings: Settings) -> EntryCheck:
        """The check with the run's key and the reward figures of `settings.admission`."""
        bounds = {"solver": SOLVER_BOUNDS, "generator": generator_bounds(settings.admission)}
        return cls(stream_key(settings), bounds)

    def forged(self, stream: str, fields: Mapping[bytes, bytes]) -> str | None:
        """Why the entry `fields` of `stream` is not one a worker holding the key wrote (None:
        it is)."""
        raw, signature = fields.get(b"group"), fields.get(b"sig")
        if raw is None or signature is None:
            return "no signature"
        if hmac.compare_digest(signature, sign(self.key, stream, raw).encode()):
            return None
        signer = fields.get(b"key_id", b"?").decode(errors="replace")[:16]
        if signer != key_id(self.key):
            return f"signed with another key (key id {signer}; the learner's is {key_id(self.key)})"
        return "the signature does not match the entry: altered after it was signed"

    def out_of_range(self, group: GradedGroup) -> str | None:
        """Why a reward of `group` is outside its role's range (None: every one is inside)."""
        low, high = self.bounds[group.role]
        for index, completion in enumerate(group.completions):
            reward = completion.reward
            if reward is not None and not low <= reward <= high:
                return f"completion {index}: reward {reward} outside [{low:.6g}, {high:.6g}]"
        return None
