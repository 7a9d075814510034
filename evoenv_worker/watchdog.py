"""The worker's watchdog: a thread of the main process of `evoenv worker` that ends a stopping
worker within seconds when its broker is gone, and stops a worker whose parent ended (the rules
and why: `Watchdog`; docs/DESIGN.md#failure-rules).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.config import Settings, mask_url

log = structlog.get_logger(__name__)

TICK = 1.0
"""Seconds between two looks at the parent, and between two PINGs of a stopping worker."""
PING_TIMEOUT = 1.0
"""Seconds a PING may take (to connect, then to answer) before it counts as unanswered."""
EXIT_STATUS = 1
"""The exit status of a worker ended because its broker was gone."""


class Watchdog:
    """Once a second, in a daemon thread (`start()`):

    - The parent ended (`os.getppid()` is no longer `parent`: the process that started the
      worker died, with or without a signal for it): it sends the worker SIGTERM, Celery's warm
      shutdown.
    - The worker is stopping (SIGTERM, SIGQUIT or Ctrl-C; `stopping()` is called from Celery's
      `worker_shutting_down` signal) and its broker has not answered a PING for `grace`
      seconds: it SIGKILLs every process below it (the pool processes and their sandboxes) and
      exits at once with status 1.

    Celery's warm shutdown waits for the running jobs without limit and ignores a second
    SIGTERM, and a job whose broker is gone can neither acknowledge nor store its result: it
    waits on Redis until its time limit (minutes; Celery's thread pool enforces none). Ending
    such a worker loses nothing: its jobs are still unacknowledged in Redis and are delivered
    again. A stopping worker whose broker answers keeps the warm shutdown.
    """

    def __init__(self, broker_url: str, grace: float, parent: int | None) -> None:
        self.broker_url = broker_url
        self.grace = grace
        self.parent = parent
        """The pid whose end stops the worker (None: none)."""
        self._stopping = threading.Event()
        self._client = redis.Redis.from_url(
            broker_url,
            socket_connect_timeout=PING_TIMEOUT,
            socket_timeout=PING_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        self._thread = threading.Thread(target=self._run, name="evoenv-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stopping(self) -> None:
        """The worker has begun to stop: from now on, a broker gone for `grace` ends it."""
        self._stopping.set()

    def broker_answers(self) -> bool:
        try:
            return bool(self._client.ping())
        except (redis.RedisError, OSError):
            return False

    def _run(self) -> None:
        while not self._stopping.wait(TICK):
            if self.parent is not None and os.getppid() != self.parent:
                log.warning("parent_gone", parent=self.parent, stopping="warm shutdown")
                self.parent = None
                os.kill(os.getpid(), signal.SIGTERM)
                self._stopping.set()  # even if something took SIGTERM over
        gone_since: float | None = None
        while True:
            now = time.monotonic()
            if self.broker_answers():
                gone_since = None
            elif gone_since is None:
                gone_since = now
                log.warning("broker_unreachable_while_stopping", grace_seconds=self.grace)
            if gone_since is not None and now - gone_since >= self.grace:
                self._end_now(now - gone_since)
            time.sleep(TICK)

    def _end_now(self, unreachable: float) -> NoReturn:
        """SIGKILL every process below this one, then exit without Celery's shutdown."""
        me = os.getpid()
        pids = descendants(me)
        log.error(
            "broker_gone_stopped_now",
            broker=mask_url(self.broker_url),
            unreachable_seconds=round(unreachable, 1),
            processes_killed=len(pids),
        )
        while pids:  # again for any started meanwhile
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pids = descendants(me) - pids
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(EXIT_STATUS)


def descendants(root: int) -> set[int]:
    """Every process below `root` (children, theirs, ...), read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


_current: Watchdog | None = None


def start(settings: Settings) -> Watchdog:
    """Start the watchdog of this worker process (`evoenv worker`, before Celery starts);
    the parent it follows is this process's parent now."""
    global _current
    w = settings.worker
    parent = os.getppid() if w.stop_with_parent else None
    _current = Watchdog(settings.redis_url, w.broker_gone_grace, parent)
    _current.start()
    return _current


def stopping() -> None:
    """The worker has begun to stop (Celery's `worker_shutting_down`); nothing without a
    watchdog (a process that is not `evoenv worker`)."""
    if _current is not None:
        _current.stopping()
