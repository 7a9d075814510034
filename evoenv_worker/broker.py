"""The workers' Redis broker transport: kombu's, except that a queue entry that is not a message
is dropped with a logged reason, and a channel outlives its connection's loss (see `Channel`).

`install()` makes it the transport of `redis://` and `rediss://` URLs; `restore_unacknowledged`
and `answering_pids` serve `evoenv up`, which watches its workers through the broker.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection
from typing import Any

import kombu.transport
import structlog
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import Empty

log = structlog.get_logger(__name__)

MALFORMED_ENTRY_ERRORS = (ValueError, KeyError, TypeError)
"""What kombu raises on an entry it cannot decode (JSON or base64 errors are ValueErrors; a
missing `properties` or `delivery_tag` a KeyError; a list or a string where a dict belongs a
TypeError)."""


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    """kombu's Redis channel, dropping queue entries that are not messages, and still able to
    reach Redis after Celery let go of its connection.

    kombu decodes each entry it pops from a queue list before Celery sees it; an entry that is
    not JSON, or not shaped like a kombu message, raises out of the event loop and Celery stops
    the worker ("Unrecoverable error"). Such an entry has no task id and nothing to retry, so it
    is logged (`bad_message`) and dropped. Payloads that are well-formed messages but fail their
    pydantic model are the tasks' business (`JobTask.decode`: dead letter with the reason).

    When Redis goes away, Celery's consumer detaches the connection from its transport
    (`Connection.collect`) and then closes it; closing a channel that holds jobs in flight hands
    them back to Redis, and a job finishing later acknowledges through the same channel. Both
    build a Redis client from the transport's connection, gone by then: kombu raised
    AttributeError, which is no connection error, so the worker stopped ("Unrecoverable error")
    and the finished job's acknowledgement was lost (it would run again after the visibility
    timeout). The channel keeps the connection parameters it was made with for those calls.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._params: dict[str, Any] = super()._connparams()

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if asynchronous or self.connection.client is not None:
            return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-any-return]
        return dict(self._params)

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)
        except MALFORMED_ENTRY_ERRORS as exc:
            # The entry is already popped (and never entered the unacknowledged set).
            reason = f"dropped a queue entry that is not a message: {type(exc).__name__}: {exc}"
            log.error("bad_message", reason=reason[:500])
            raise Empty() from exc


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


SCHEMES = ("redis", "rediss")


def install() -> None:
    """Use `Transport` for the `redis://` and `rediss://` URLs of this process.

    These are kombu's transport aliases, so URLs and everything that reads them (Flower's queue
    lengths) stay as they are.
    """
    for scheme in SCHEMES:
        kombu.transport.TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
        # A connection made before this (none in our entry points) cached kombu's own class.
        kombu.transport._transport_cache.pop(scheme, None)


def restore_unacknowledged(
    url: str,
    queues: Collection[str] | None = None,
    older_than: float | None = None,
    timeout: float = 5.0,
) -> int:
    """Hand back to the head of their queue the jobs taken and not acknowledged, and say how
    many: those routed to `queues` only (None: any queue), and with `older_than`, only those
    taken more than that many seconds ago. `evoenv up` calls it when the one worker of a queue
    has died (its jobs, at once: no live worker holds them) and every `SWEEP_SECONDS` with the
    visibility timeout (kombu's own rule, which a worker's restore loop stops applying when a
    Redis restart breaks it). A job routed to another queue, or taken later, stays."""
    wanted = set(queues) if queues is not None else None
    restored = 0
    options = {"socket_timeout": timeout, "max_retries": 1}  # Redis down: fail, never wait
    with kombu.Connection(url, connect_timeout=timeout, transport_options=options) as connection:
        channel = connection.default_channel
        client = channel.client
        taken = dict(client.zrange(channel.unacked_index_key, 0, -1, withscores=True))
        ceiling = time.time() - older_than if older_than is not None else float("inf")
        for tag, raw in client.hgetall(channel.unacked_key).items():
            if taken.get(tag, 0.0) >= ceiling:
                continue
            try:
                _, exchange, routing_key = json.loads(raw)
                targets = set(channel._lookup(exchange, routing_key))
            except MALFORMED_ENTRY_ERRORS:
                continue  # not kombu's: left for its own restore to judge
            if targets and (wanted is None or targets <= wanted):
                channel.qos.restore_by_tag(tag, client=client, leftmost=True)
                restored += 1
    return restored


NODE = re.compile(r"^[^@]*-(\d+)@")
"""A worker's node name as `evoenv worker` sets it: QUEUES-PID@HOST."""
_ping_apps: dict[str, Any] = {}


def answering_pids(redis_url: str, timeout: float) -> set[int]:
    """The pids of the workers that answered a ping (Celery's remote control) within `timeout`
    seconds, read from their node names (`NODE`); a worker named otherwise is not counted."""
    from celery import Celery

    app = _ping_apps.get(redis_url)
    if app is None:
        app = _ping_apps[redis_url] = Celery("evoenv-ping", broker=redis_url, set_as_current=False)
    replies = app.control.ping(timeout=timeout) or []
    return {
        int(found.group(1))
        for reply in replies
        for node in reply
        if (found := NODE.match(node)) is not None
    }
