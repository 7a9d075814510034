"""The rollout consumer: reads graded groups from the run's stream with a consumer group.

Exactly-once training over at-least-once delivery: an entry stays pending until a checkpoint
that includes it is written (see `RolloutConsumer`;
docs/DESIGN.md#the-rollout-stream-and-the-learner).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import structlog
from pydantic import ValidationError

from shared import keys
from shared.errors import SchemaMismatch
from shared.messages import (
    OLDEST_READ_VERSION,
    SCHEMA_VERSION,
    GeneratorGroupData,
    GradedGroup,
)
from shared.rollouts import EntryCheck, decode_entry, written_version

log = structlog.get_logger(__name__)

GROUP = "learner"


@dataclass
class ConsumerStats:
    read: int = 0
    stale: int = 0
    malformed: int = 0
    unreadable: int = 0
    """Entries of a message schema version this learner does not read."""
    duplicates: int = 0
    reclaimed: int = 0
    forged: int = 0
    """Entries with no valid signature: not written by a worker holding the key, or altered."""
    out_of_range: int = 0
    """Signed entries with a reward outside its role's range."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A group read from the stream and not trained: its slot is to be freed all the same."""

    group_id: str
    role: str
    why: str
    """`stale`, `malformed`, `unreadable` (another message schema version) or `out_of_range`."""
    funnel: tuple[str, ...] = ()
    """A generation group's admission outcomes, one per candidate (they happened)."""


@dataclass
class RolloutConsumer:
    """Reads the run's rollout stream as one consumer of its consumer group.

    Exactly-once training over at-least-once delivery:

    - entries are read with XREADGROUP, so each is delivered to one consumer and stays
      *pending* until acknowledged;
    - the learner acknowledges (XACK) and deletes (XDEL) an entry only once it is done with
      (trained, skipped, or dropped: `done`) and a checkpoint that includes it is written:
      `take_for_checkpoint` hands the checkpoint the ids done since the last one, `acknowledge`
      is called after the checkpoint is on disk;
    - a group read and settled but not yet trained when a checkpoint is written (queued, or in
      a step a stop abandoned) stays pending: the checkpoint lists it (`held`), its counts
      being in the checkpoint's funnel; the learner resumed from that checkpoint reads it again
      and trains it without counting it again (`settled`);
    - on resume, ids the checkpoint recorded but never acknowledged are acknowledged first
      (they are in the weights already), then the consumer re-reads its own pending entries
      (read but not done in any checkpoint: the weights were rolled back, so training on them
      again is right);
    - entries left pending by a dead consumer for `claim_idle_ms` are reclaimed (XPENDING, then
      XCLAIM);
    - groups older than `max_staleness` policy versions are dropped, counted and logged;
    - an entry that cannot be read (malformed, or written with a message schema version this
      learner does not read: `shared/messages.py`) is dropped with one log line that says why
      and names the versions, and acknowledged with the next checkpoint like any other: never
      a crash, never read again;
    - an entry without a valid signature (`check.forged`: written by anyone but a worker with
      the key, or altered since) is dropped, counted (`stats.forged`) and logged before it is
      read at all, and frees no slot: nothing it says is believed; a signed one with a reward
      outside its role's range (`check.out_of_range`) is dropped and counted too
      (`stats.out_of_range`); both are acknowledged with the next checkpoint;
    - a dropped group (stale, out of range, or unreadable but naming its group) is handed to
      the learner by `take_dropped`, so that the slot it held in the orchestrator is freed.
    """

    client: aioredis.Redis
    run: str
    consumer: str
    max_staleness: int
    check: EntryCheck
    """The signature and reward ranges every entry is checked against."""
    claim_idle_ms: int = 60_000
    stats: ConsumerStats = field(default_factory=ConsumerStats)
    _unacked: list[str] = field(default_factory=list)
    """Ids done with (trained, skipped, dropped or malformed) since the last checkpoint."""
    _held: dict[str, str] = field(default_factory=dict)
    """Entry ids of the groups read and handed on, not yet done with, by group id."""
    _settled: set[str] = field(default_factory=set)
    """Entry ids the checkpoint resumed from holds as read, settled and not yet trained."""
    _seen: set[str] = field(default_factory=set)
    _dropped: list[Dropped] = field(default_factory=list)
    _backlog_done: bool = False
    _backlog_cursor: str = "0"

    @property
    def stream(self) -> str:
        return keys.rollout_stream(self.run)

    async def start(
        self, checkpointed_unacked: list[str] | None = None, held: list[str] | None = None
    ) -> None:
        """Create the consumer group if needed; settle what the last checkpoint included: the
        ids it was done with are acknowledged, those it `held` come back as `settled`."""
        try:
            await self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except aioredis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._settled = set(held or ())
        if checkpointed_unacked:
            self._seen.update(checkpointed_unacked)
            await self.acknowledge(list(checkpointed_unacked))

    async def read(self, count: int, block_ms: int, current_version: int) -> list[GradedGroup]:
        """Up to `count` fresh groups: own pending first (after a restart), then reclaimed
        ones, then new ones (blocking up to `block_ms`)."""
        entries: list[tuple[str, dict[bytes, bytes]]] = []
        if not self._backlog_done:  # own pending entries (after a restart), oldest first
            backlog = await self._xread(self._backlog_cursor, count, None)
            if backlog:
                self._backlog_cursor = backlog[-1][0]
            self._backlog_done = len(backlog) < count
            entries += backlog
        if len(entries) < count:
            entries += await self._reclaim(count - len(entries))
        if len(entries) < count:
            entries += await self._xread(">", count - len(entries), block_ms)
        return [g for g in (self._accept(eid, f, current_version) for eid, f in entries) if g]

    async def _xread(
        self, start: str, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[bytes, bytes]]]:
        reply = await self.client.xreadgroup(
            GROUP, self.consumer, {self.stream: start}, count=count, block=block_ms
        )
        out: list[tuple[str, dict[bytes, bytes]]] = []
        for _stream, messages in reply or []:
            out += [(_id(eid), fields) for eid, fields in messages if fields]
        return out

    async def _reclaim(self, count: int) -> list[tuple[str, dict[bytes, bytes]]]:
        """Entries another (dead) consumer read and left pending for `claim_idle_ms`. This
        consumer's own pending entries are waiting for a checkpoint: never re-read them."""
        pending = await self.client.xpending_range(
            self.stream, GROUP, min="-", max="+", count=max(count * 4, 64), idle=self.claim_idle_ms
        )
        ids = [p["message_id"] for p in pending if _id(p["consumer"]) != self.consumer][:count]
        if not ids:
            return []
        messages = await self.client.xclaim(
            self.stream, GROUP, self.consumer, min_idle_time=self.claim_idle_ms, message_ids=ids
        )
        claimed = [(_id(eid), fields) for eid, fields in messages if fields]
        if claimed:
            self.stats.reclaimed += len(claimed)
            log.info("rollouts_reclaimed", count=len(claimed))
        return claimed

    def _accept(
        self, entry_id: str, fields: dict[bytes, bytes], current_version: int
    ) -> GradedGroup | None:
        if entry_id in self._seen:
            self.stats.duplicates += 1
            return None
        self._seen.add(entry_id)
        group = self._decode(entry_id, fields, current_version)
        if group is None:
            self._unacked.append(entry_id)  # dropped where read: done with
        else:
            self._held[group.group_id] = entry_id
        return group

    def _decode(
        self, entry_id: str, fields: dict[bytes, bytes], current_version: int
    ) -> GradedGroup | None:
        group = self._checked(entry_id, fields)
        if group is None:
            return None
        if current_version - group.policy_version > self.max_staleness:
            self.stats.stale += 1
            self._dropped.append(Dropped(group.group_id, group.role, "stale", _funnel(group)))
            log.info(
                "rollout_stale",
                entry=entry_id,
                group=group.group_id,
                version=group.policy_version,
                current=current_version,
            )
            return None
        self.stats.read += 1
        return group

    def _checked(self, entry_id: str, fields: dict[bytes, bytes]) -> GradedGroup | None:
        """The entry's group if it is signed, readable and its rewards in range; else None,
        the entry dropped, counted and logged."""
        forged = self.check.forged(self.stream, fields)
        if forged is not None:
            self.stats.forged += 1
            log.error(
                "rollout_forged",
                entry=entry_id,
                error=f"dropped: {forged}",
                count=self.stats.forged,
            )
            return None
        try:
            group = decode_entry(fields)
        except SchemaMismatch as exc:
            self.stats.unreadable += 1
            log.error("rollout_unreadable", entry=entry_id, error=f"dropped: {exc}")
            self._drop_named(fields, "unreadable")
            return None
        except (ValidationError, KeyError) as exc:
            self.stats.malformed += 1
            log.error(
                "rollout_malformed",
                entry=entry_id,
                schema_version=written_version(fields.get(b"group", b"")),
                reads_versions=f"{OLDEST_READ_VERSION}-{SCHEMA_VERSION}",
                error=str(exc)[:300],
            )
            self._drop_named(fields, "malformed")
            return None
        wrong = self.check.out_of_range(group)
        if wrong is not None:
            self.stats.out_of_range += 1
            self._dropped.append(
                Dropped(group.group_id, group.role, "out_of_range", _funnel(group))
            )
            log.error(
                "rollout_out_of_range",
                entry=entry_id,
                group=group.group_id,
                role=group.role,
                error=f"dropped: {wrong}",
                count=self.stats.out_of_range,
            )
            return None
        return group

    def _drop_named(self, fields: dict[bytes, bytes], why: str) -> None:
        """An entry that could not be read frees the slot of the group it names, if any."""
        named = _named(fields)
        if named is not None:
            self._dropped.append(Dropped(*named, why=why))

    def take_dropped(self) -> list[Dropped]:
        """The groups dropped since the last call."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def settled(self, group: GradedGroup) -> bool:
        """Whether `group` was read and settled before the checkpoint resumed from (its counts
        are in that checkpoint): it goes to the trainer without being settled again."""
        return self._held.get(group.group_id) in self._settled

    def done(self, groups: Iterable[GradedGroup]) -> None:
        """`groups` (read from this consumer) are done with: trained, skipped or dropped. They
        are acknowledged with the next checkpoint."""
        for group in groups:
            entry_id = self._held.pop(group.group_id, None)
            if entry_id is not None:
                self._settled.discard(entry_id)
                self._unacked.append(entry_id)

    @property
    def has_unacknowledged(self) -> bool:
        return bool(self._unacked)

    def held(self) -> list[str]:
        """The entry ids read and not yet done with (queued, or in an unfinished step): a
        checkpoint lists them; they stay pending."""
        return list(self._held.values())

    def take_for_checkpoint(self) -> list[str]:
        """The ids done with since the last checkpoint: store them in the checkpoint, then call
        `acknowledge` with them once it is written."""
        ids, self._unacked = self._unacked, []
        return ids

    async def acknowledge(self, ids: list[str]) -> None:
        if not ids:
            return
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, GROUP, *ids)
            pipe.xdel(self.stream, *ids)
            await pipe.execute()

    async def backlog(self) -> int:
        """Entries in the stream not yet delivered to the learner."""
        try:
            groups = await self.client.xinfo_groups(self.stream)
        except aioredis.ResponseError:
            return 0
        for info in groups:
            if _id(info.get("name", b"")) == GROUP:
                lag = info.get("lag")
                return int(lag) if lag is not None else 0
        return 0


def _funnel(group: GradedGroup) -> tuple[str, ...]:
    """A generation group's admission outcomes (they happened, whatever becomes of it)."""
    return tuple(group.data.funnel) if isinstance(group.data, GeneratorGroupData) else ()


def _named(fields: dict[bytes, bytes]) -> tuple[str, str] | None:
    """The group id and role a malformed entry still names, if it does."""
    try:
        raw = json.loads(fields[b"group"])
    except (KeyError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    group_id, role = raw.get("group_id"), raw.get("role")
    if not isinstance(group_id, str) or role not in ("solver", "generator"):
        return None
    return group_id, role


def _id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
