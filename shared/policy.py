"""The policy version: a monotonic integer in Redis, owned by the learner, read by workers.

The learner's weight publisher sets it (only upwards) once every vLLM server serves the new
weights; a worker reads it just before it asks a server that does not report per-token weight
versions, and tags the completion with it. A missing key reads as 0: the initial weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import redis
import redis.asyncio

from shared import keys
from shared.errors import EvoEnvError, ServiceUnavailable

_SET_IF_GREATER = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new <= current then
  return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, new}
"""


def adapter_name(version: int) -> str:
    """The name LoRA mode loads a policy version's adapter under on every server."""
    return f"policy-v{version}"


def adapter_versions(names: Iterable[str]) -> list[int]:
    """The policy versions among adapter names (`policy-v{N}`); other adapters are not ours."""
    prefix = adapter_name(0)[:-1]
    return [
        int(n[len(prefix) :]) for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()
    ]


class VersionNotIncreased(EvoEnvError):
    """A version was published that is not greater than the one in Redis (never reused)."""


def _parse(raw: Any) -> int:
    if raw is None:
        return 0
    return int(raw.decode() if isinstance(raw, bytes) else raw)


def read_version(client: redis.Redis) -> int:
    """The current policy version (0 if none was ever published)."""
    try:
        return _parse(client.get(keys.POLICY_VERSION))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable(f"cannot read the policy version from Redis: {exc}") from exc


async def read_version_async(client: redis.asyncio.Redis) -> int:
    """`read_version` for an asyncio Redis client."""
    try:
        return _parse(await client.get(keys.POLICY_VERSION))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable(f"cannot read the policy version from Redis: {exc}") from exc


def publish_version(client: redis.Redis, version: int) -> int:
    """Set the policy version to `version`, which must be greater than the current one."""
    try:
        result = cast(Any, client.eval(_SET_IF_GREATER, 1, keys.POLICY_VERSION, str(version)))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable(f"cannot publish policy version {version}: {exc}") from exc
    return _checked(version, result)


async def publish_version_async(client: redis.asyncio.Redis, version: int) -> int:
    """`publish_version` for an asyncio Redis client."""
    try:
        result = await cast(Any, client.eval(_SET_IF_GREATER, 1, keys.POLICY_VERSION, str(version)))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable(f"cannot publish policy version {version}: {exc}") from exc
    return _checked(version, result)


def _checked(wanted: int, result: Any) -> int:
    stored, current = int(result[0]), int(result[1])
    if not stored:
        raise VersionNotIncreased(
            f"policy version {wanted} was not published: Redis already holds {current}"
        )
    return current
