"""The process between `evoenv up` and each child: `python reaper.py GRACE -- ARGV...` runs ARGV
in a process group of its own as a child subreaper, stops it on SIGTERM, SIGINT or SIGHUP (the
parent-death signal when `up` dies) and kills every descendant left after GRACE or once ARGV
exits; it forwards SIGUSR1/2 and exits as ARGV did. Standard library only, run as a file so that
it starts in milliseconds (docs/DESIGN.md#the-supervisor-in-evoenv-up)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's own tracking still kills what it saw


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill_all(me: int) -> None:
    for pid in _descendants(me):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: reaper.py GRACE -- COMMAND [ARG...]\n")
        return 2
    grace, command = float(argv[0]), argv[2:]
    _become_subreaper()
    me = os.getpid()
    child = os.posix_spawnp(command[0], command, os.environ, setpgroup=0)
    stop_at: list[float] = []

    def stop(*_: object) -> None:
        if not stop_at:
            stop_at.append(time.monotonic() + grace)
            try:
                os.killpg(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
            signal.setitimer(signal.ITIMER_REAL, grace)

    def overdue(*_: object) -> None:
        _kill_all(me)

    def forward(signum: int, _: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    signal.signal(signal.SIGALRM, overdue)
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = code
            _kill_all(me)  # ARGV is gone: nothing it left may stay
    signal.setitimer(signal.ITIMER_REAL, 0)
    if status is None:
        return 1
    if os.WIFSIGNALED(status):
        ended_by = os.WTERMSIG(status)
        if ended_by != signal.SIGKILL:
            signal.signal(ended_by, signal.SIG_DFL)
        os.kill(me, ended_by)  # end as ARGV did
        return 128 + ended_by
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
