"""Workers that stop answering: `evoenv up` pings its Celery workers every `EVERY` seconds and
replaces one that missed every ping for `worker.unresponsive_after` seconds while another
worker answered them (a stopped, hung or deadlocked process; not a broker outage). Each queue
has one worker in `up`, so a silent one would hold its queue's jobs until it came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

EVERY = 15.0
"""Seconds between pings."""
PING_TIMEOUT = 5.0
"""Seconds a ping waits for the workers' answers."""


@dataclass
class Silence:
    """Consecutive pings each worker (by pid) missed while another worker answered; counted
    only for a worker that answered once since it started (its start-up is not silence)."""

    after: float
    every: float = EVERY
    misses: dict[int, int] = field(default_factory=dict)

    def heard(self, answered: set[int], running: Sequence[int]) -> list[int]:
        """One ping's answers: the running workers silent for `after` seconds (to replace).
        A ping nobody answered says nothing about the workers (the broker is away)."""
        for pid in list(self.misses):
            if pid not in running:
                del self.misses[pid]  # gone (restarted under another pid)
        for pid in answered & set(running):
            self.misses[pid] = 0
        if not answered:
            return []
        for pid in running:
            if pid in self.misses and pid not in answered:
                self.misses[pid] += 1
        limit = max(1, math.ceil(self.after / self.every))
        silent = [pid for pid in running if self.misses.get(pid, 0) >= limit]
        for pid in silent:
            del self.misses[pid]
        return silent


async def replace_silent(
    workers: Sequence[Any],
    redis_url: str,
    after: float,
    command_pid: Callable[[int], int | None],
    say: Callable[[str], None],
) -> None:
    """Ping `workers` (supervised `Child`ren) every `EVERY` seconds; SIGKILL the process group
    of one silent for `after` seconds, so that the supervisor restarts it as a death (its jobs
    in hand given back). Runs until cancelled."""
    from evoenv_worker.broker import answering_pids

    silence = Silence(after, EVERY)
    while True:
        await asyncio.sleep(EVERY)
        running = {
            pid: child
            for child in workers
            if child.alive and (pid := command_pid(child.proc.pid)) is not None
        }
        try:
            answered = await asyncio.to_thread(answering_pids, redis_url, PING_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 (Redis away: kombu's or redis's errors)
            log.debug("ping_skipped", error=str(exc))
            continue
        for pid in silence.heard(answered, list(running)):
            child = running[pid]
            say(f"{child.name} answered no ping for {after:g} s; killed to be restarted")
            log.warning("worker_unresponsive", child=child.name, pid=pid, seconds=after)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
