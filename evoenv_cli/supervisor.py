"""Child processes of `evoenv up`: start them, restart the ones that die (saying how each ended,
`exit_reason`), stop them all. Each child runs in its own session, its output in RUN/logs/NAME.log,
behind a reaper (`reaper.py`) started under a parent-death signal, so that nothing outlives
`evoenv up` however it ends (docs/DESIGN.md#the-supervisor-in-evoenv-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

STOP_GRACE = 20.0
"""Seconds a child has to exit after SIGTERM before SIGKILL."""
REAPER = Path(__file__).with_name("reaper.py")
REAPER_MARGIN = 5.0
"""Seconds past a child's grace that the supervisor waits for its reaper, which kills what is
left at the grace itself, before it kills them both."""


@dataclass
class Child:
    """One supervised process, in its own session, its output in `log_path`.

    `proc` is its reaper (`reaper.py`), which runs `argv` in a process group of its own and
    adopts every orphan among its descendants. Stopping sends the reaper SIGTERM: it passes
    it to the child's group and SIGKILLs whatever is left once the `grace` is over, so nothing
    is left behind (vLLM's engine and Celery's pool processes included). Descendants are also
    tracked from /proc while the child lives and killed with it, should the reaper itself be
    killed. The reaper is started under `setpriv --pdeathsig TERM` (Linux's parent-death signal,
    kept across exec), so the child also stops when the supervising process dies without
    stopping it (`kill -9`, the kernel's out-of-memory killer, a crash).
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
    max_restarts: int | None = None
    """Restarts before the supervisor gives up on it (None: the supervisor's `max_restarts`)."""
    finishes: bool = False
    """An exit with status 0 is the end of the run (the learner done with its steps), not a
    death: the supervisor then stops watching instead of restarting it."""
    died: Callable[[str], None] | None = None
    """Called with the line that says how it ended, after it died and before its restart (the
    learner: resume the model servers its step may have left paused)."""
    tree: set[int] = field(default_factory=set)
    """Its descendants as last seen (`Supervisor.watch` refreshes it)."""
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    oom_kills_at_start: int | None = None
    """The cgroup's out-of-memory kill count when it started (`oom_kills`)."""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start it. It gets SIGTERM when the thread that called this ends (the parent-death
        signal is the starting thread's): call it from the thread that supervises, which in
        `evoenv up` is the main thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.oom_kills_at_start = oom_kills()
        reaped = [sys.executable, str(REAPER), str(self.grace), "--", *self.argv]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                _dies_with_us(reaped),
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

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the child (through its reaper, which passes SIGUSR1 and SIGUSR2 on
        and stops the child on SIGTERM); nothing if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its reaper, which passes it to the child's group and
        kills what is left after the grace); `finish` waits for it."""
        self.send_signal(signal.SIGTERM)

    def finish(self, signalled: float) -> None:
        """Wait for it until its `grace` from `signalled` (the time.monotonic() of the SIGTERM)
        and the reaper's margin are over, then SIGKILL whatever is left of it and its
        descendants."""
        proc = self.proc
        if proc is None:
            return
        self.tree |= descendants(proc.pid)
        try:
            proc.wait(max(signalled + self.grace + REAPER_MARGIN - time.monotonic(), 0.0))
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
    `max_restarts` times (or its own `Child.max_restarts`) in a row: a child that ran
    `stable_after` seconds since its last start has its count start again at its next death,
    so the limit stops a child that cannot run, not a long run with a death now and then."""

    children: list[Child] = field(default_factory=list)
    max_restarts: int = 5
    stable_after: float = 600.0
    events: list[str] = field(default_factory=list)
    gave_up: str | None = None
    """The child that died more than its restarts allow (the watch then returns)."""
    gave_up_reason: str = ""
    """How that child ended the last time (`exit_reason`)."""
    finished: str | None = None
    """The child (one that `finishes`) whose exit with status 0 ended the watch."""
    on_event: Callable[[str], None] | None = None
    """Called with each line added to `events` (`evoenv up` prints them)."""

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def say(self, line: str) -> None:
        self.events.append(line)
        if self.on_event is not None:
            self.on_event(line)

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
        """Restart children that die until `stop` is set (or one that `finishes` exits 0)."""
        while not stop.is_set():
            parents = process_parents()  # one /proc scan a tick for every child
            for child in self.children:
                if child.alive:
                    child.tree |= descendants(child.proc.pid, parents=parents)  # type: ignore[union-attr]
                if child.proc is not None and not child.alive and not stop.is_set():
                    await self._died(child, stop, start_timeout)
                    if stop.is_set():
                        break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    async def _died(self, child: Child, stop: asyncio.Event, start_timeout: float) -> None:
        """`child` is no longer running: the end of the run (it `finishes` and exited 0), a
        restart, or, past its restarts, the supervisor giving up (both set `stop`)."""
        proc = child.proc
        assert proc is not None
        code = proc.returncode
        pids = {proc.pid} | child.tree
        child.kill_tree()
        if child.finishes and code == 0:
            log.info("child_finished", child=child.name)
            self.finished = child.name
            child.proc = None
            stop.set()
            return
        reason = exit_reason(code, pids, child.oom_kills_at_start)
        if child.restarts and time.monotonic() - child.started_at >= self.stable_after:
            child.restarts = 0  # it ran long enough: an earlier death is forgiven
        limit = self.max_restarts if child.max_restarts is None else child.max_restarts
        if child.died is not None:
            child.died(reason)
        if child.restarts >= limit:
            self.say(f"{child.name} {reason}, after {child.restarts} restarts; giving up")
            log.error("child_gave_up", child=child.name, code=code, reason=reason)
            self.gave_up, self.gave_up_reason = child.name, reason
            child.proc = None
            stop.set()
            return
        child.restarts += 1
        self.say(f"{child.name} {reason}; restart {child.restarts} of {limit}")
        log.warning(
            "child_died", child=child.name, code=code, reason=reason, restart=child.restarts
        )
        with contextlib.suppress(TimeoutError):  # a stop during the delay: no restart
            await asyncio.wait_for(stop.wait(), timeout=min(2.0**child.restarts, 30.0))
        if stop.is_set():
            child.proc = None
            return
        try:
            await self.start(child, start_timeout)
        except RuntimeError as exc:
            log.error("child_restart_failed", child=child.name, error=str(exc)[:500])
            return
        log.info("child_restarted", child=child.name, restart=child.restarts)
        if child.restarted is not None:
            child.restarted()

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


def command_pid(reaper: int) -> int | None:
    """The command a child's reaper runs (its one child process), if it runs."""
    found = [pid for pid, parent in process_parents().items() if parent == reaper]
    return found[0] if found else None


def exit_reason(code: int | None, pids: set[int], oom_kills_at_start: int | None = None) -> str:
    """How a child ended, in words: "exited with status 1", "was killed by SIGKILL", and for a
    SIGKILL, "(the kernel's out-of-memory killer)" where the kernel's log names one of `pids`
    (the child and its descendants), or the cgroup's out-of-memory kill count rose since
    `oom_kills_at_start`."""
    if code is None:
        return "ended"
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    reason = f"was killed by {name}"
    if -code == signal.SIGKILL:
        after = oom_kills()
        if kernel_oom_killed(pids) or (
            oom_kills_at_start is not None and after is not None and after > oom_kills_at_start
        ):
            reason += " (the kernel's out-of-memory killer)"
    return reason


_KILLED = re.compile(r"Killed process (\d+)")


def kernel_oom_killed(pids: set[int]) -> bool:
    """Whether the kernel's log (/dev/kmsg, where readable) says its out-of-memory killer
    killed one of `pids`."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: records overwritten while reading; read on
                continue
            if not record:
                return False
            found = _KILLED.search(record.decode("utf-8", "replace"))
            if found and int(found.group(1)) in pids:
                return True
    finally:
        os.close(fd)


def oom_kills() -> int | None:
    """The out-of-memory kills counted by this process's memory cgroup (cgroup v2's
    memory.events, v1's memory.oom_control), None where neither is readable."""
    for path in _memory_cgroup_files():
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def _memory_cgroup_files() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    files = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                files.append(root / path.lstrip("/") / "memory.events")
            elif "memory" in controllers.split(","):
                files += [root / "memory" / path.lstrip("/") / "memory.oom_control"]
    except (OSError, ValueError):
        pass
    return [*files, root / "memory.events", root / "memory" / "memory.oom_control"]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""
