"""Child processes of `evoenv up`: start them, restart the ones that die, stop them all.

Each child runs in its own session with its output in RUN/logs/NAME.log, under a parent-death
signal, so that nothing outlives `evoenv up` (see `Child`, `Supervisor`;
docs/DESIGN.md#the-supervisor-in-evoenv-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

STOP_GRACE = 20.0
"""Seconds a child has to exit after SIGTERM before SIGKILL."""


@dataclass
class Child:
    """One supervised process, in its own session (process group), its output in `log_path`.

    Stopping sends SIGTERM to the whole group, then SIGKILL once its `grace` is over, so nothing
    is left behind (vLLM's engine and Celery's pool processes included). Descendants that left
    the group (a process that starts its own session) are tracked from /proc while the child
    lives and killed with it: otherwise a killed child's orphans can keep its port. It also
    stops when the supervising process dies without stopping it (`kill -9`, a crash): it is
    started under `setpriv --pdeathsig TERM` (Linux's parent-death signal, kept across exec).
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool] | None = None
    """Returns True once the child serves (polled after each start)."""
    restarted: Callable[[], None] | None = None
    """Called once a restarted child is ready again (the vLLM server: push the weights)."""
    cpus: frozenset[int] | None = None
    """Cores the child may run on (None: the parent's at the time of the start)."""
    layer: int = 0
    """Stop order: higher layers stop first, one layer at a time (`Supervisor.stop_all`)."""
    grace: float = STOP_GRACE
    """Seconds it has to exit after SIGTERM before SIGKILL."""
    tree: set[int] = field(default_factory=set)
    """Its descendants as last seen (`Supervisor.watch` refreshes it)."""
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start it. It gets SIGTERM when the thread that called this ends (the parent-death
        signal is the starting thread's): call it from the thread that supervises, which in
        `evoenv up` is the main thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                _dies_with_us(self.argv),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if self.cpus:
            os.sched_setaffinity(self.proc.pid, self.cpus)  # before it starts its threads
        self.started_at = time.monotonic()
        log.info("child_started", child=self.name, pid=self.proc.pid)

    def terminate(self) -> None:
        """Ask its whole group to stop (SIGTERM); `finish` waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def finish(self, signalled: float) -> None:
        """Wait for it until its `grace` from `signalled` (the time.monotonic() of the SIGTERM)
        is over, then SIGKILL whatever is left of its group and descendants."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(max(signalled + self.grace - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            log.warning("child_killed", child=self.name, after_seconds=self.grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group
        proc.wait()
        self.kill_tree()
        self.proc = None

    def kill_tree(self) -> None:
        """SIGKILL what is left of the descendants last seen (and theirs)."""
        for pid in self.tree | descendants(*self.tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.tree = set()


@dataclass
class Supervisor:
    """The children of `evoenv up`; one that dies is restarted with a growing delay, at most
    `max_restarts` times."""

    children: list[Child] = field(default_factory=list)
    max_restarts: int = 5
    events: list[str] = field(default_factory=list)
    gave_up: str | None = None
    """The child that died more than `max_restarts` times (the watch then returns)."""

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    async def start(self, child: Child, timeout: float) -> None:
        """Start `child` and wait until it is ready (or raise with the tail of its log)."""
        child.start()
        deadline = time.monotonic() + timeout
        while child.ready is not None and not await asyncio.to_thread(child.ready):
            if not child.alive:
                raise RuntimeError(
                    f"{child.name} exited during start-up; see {child.log_path}:\n{_tail(child.log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{child.name} was not ready after {timeout:.0f} s; see {child.log_path}"
                )
            await asyncio.sleep(0.5)

    async def watch(self, stop: asyncio.Event, start_timeout: float = 300.0) -> None:
        """Restart children that die until `stop` is set."""
        while not stop.is_set():
            parents = process_parents()  # one /proc scan a tick for every child
            for child in self.children:
                if child.alive:
                    child.tree |= descendants(child.proc.pid, parents=parents)  # type: ignore[union-attr]
                if child.proc is not None and not child.alive and not stop.is_set():
                    child.kill_tree()
                    code = child.proc.returncode
                    if child.restarts >= self.max_restarts:
                        self.events.append(f"{child.name} died (exit {code}) too often; giving up")
                        log.error("child_gave_up", child=child.name, code=code)
                        self.gave_up = child.name
                        stop.set()
                        break
                    child.restarts += 1
                    self.events.append(f"{child.name} died (exit {code}); restart {child.restarts}")
                    log.warning("child_died", child=child.name, code=code, restart=child.restarts)
                    await asyncio.sleep(min(2.0**child.restarts, 30.0))
                    try:
                        await self.start(child, start_timeout)
                    except RuntimeError as exc:
                        log.error("child_restart_failed", child=child.name, error=str(exc)[:500])
                        continue
                    log.info("child_restarted", child=child.name, restart=child.restarts)
                    if child.restarted is not None:
                        child.restarted()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    def stop_all(self) -> None:
        """Stop every child: layer by layer, highest first (the workers before the services
        they use); within a layer all at once, each given its `grace` from the layer's SIGTERM
        before SIGKILL. One after the other, a Ctrl-C of `evoenv up` took much longer
        (docs/results.md#figures-behind-defaults)."""
        for layer in sorted({child.layer for child in self.children}, reverse=True):
            children = [child for child in self.children if child.layer == layer]
            for child in children:
                child.terminate()
            signalled = time.monotonic()
            for child in children:
                child.finish(signalled)


def _dies_with_us(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when its parent dies: `setpriv` sets the signal and
    execs it (no Python runs between fork and exec, unlike a `preexec_fn`, which is unsafe in
    a process with threads). Where no setpriv with `--pdeathsig` is found, `argv` as it is."""
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


@functools.cache
def _setpriv() -> str | None:
    """util-linux's setpriv, if it has `--pdeathsig` (2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    probe = subprocess.run([path, "--pdeathsig", "TERM", "--", "true"], capture_output=True)
    return path if probe.returncode == 0 else None


def descendants(*roots: int, parents: dict[int, int] | None = None) -> set[int]:
    """Every live descendant of the `roots`, from /proc (or from `parents`, a snapshot of
    `process_parents()` shared by several calls)."""
    parents = process_parents() if parents is None else parents
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every live process, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = int(fields[1])
    return parents


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""
