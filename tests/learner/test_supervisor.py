"""The supervisor of `evoenv up`, on real child processes: a killed child is restarted and its
`restarted` hook runs; one that keeps dying is given up on; stopping leaves no process, and
neither does a supervisor killed outright."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from evoenv_cli.supervisor import Child, Supervisor, exit_reason, oom_kills, process_parents


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _command_pid(child: Child) -> int:
    """The child's command: its reaper's own child (`reaper.py`)."""
    (pid,) = [
        pid
        for pid, parent in process_parents().items()
        if parent == child.proc.pid  # type: ignore[union-attr]
    ]
    return pid


def test_a_killed_child_is_restarted_and_its_hook_runs(tmp_path: Path) -> None:
    calls: list[str] = []
    child = Child(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(600)"],
        dict(os.environ),
        tmp_path / "sleeper.log",
        restarted=lambda: calls.append("restarted"),
    )
    supervisor = Supervisor()
    supervisor.add(child)

    async def scenario() -> tuple[int, int]:
        stop = asyncio.Event()
        await supervisor.start(child, timeout=10)
        first = child.proc.pid  # type: ignore[union-attr]
        watcher = asyncio.create_task(supervisor.watch(stop))
        os.killpg(first, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not calls and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        second = child.proc.pid  # type: ignore[union-attr]
        stop.set()
        await watcher
        return first, second

    first, second = asyncio.run(scenario())
    assert calls == ["restarted"]
    assert first != second and child.restarts == 1 and child.alive
    supervisor.stop_all()
    assert not _alive(second) and supervisor.gave_up is None


def test_a_child_that_keeps_dying_is_given_up(tmp_path: Path) -> None:
    child = Child("crasher", [sys.executable, "-c", "raise SystemExit(7)"], {}, tmp_path / "c.log")
    supervisor = Supervisor(max_restarts=1)
    supervisor.add(child)

    async def scenario() -> None:
        stop = asyncio.Event()
        child.start()
        await asyncio.wait_for(supervisor.watch(stop), timeout=30)
        assert stop.is_set()

    asyncio.run(scenario())
    assert supervisor.gave_up == "crasher" and child.restarts == 1
    assert any("giving up" in event for event in supervisor.events)
    supervisor.stop_all()


def test_a_child_that_ran_long_enough_has_its_restarts_counted_again(tmp_path: Path) -> None:
    # the limit stops a child that cannot run; in a long run, deaths minutes apart are each
    # restarted (here: three SIGKILLs, a limit of one, "long enough" 1 s)
    child = Child(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(600)"],
        dict(os.environ),
        tmp_path / "sleeper.log",
    )
    supervisor = Supervisor(max_restarts=1, stable_after=1.0)
    supervisor.add(child)

    async def scenario() -> None:
        stop = asyncio.Event()
        await supervisor.start(child, timeout=10)
        watcher = asyncio.create_task(supervisor.watch(stop))
        for _ in range(3):
            before = child.proc.pid  # type: ignore[union-attr]
            await asyncio.sleep(1.5)  # longer than stable_after
            os.killpg(before, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                child.proc is None or child.proc.pid == before or not child.alive
            ):
                await asyncio.sleep(0.1)
        stop.set()
        await watcher

    asyncio.run(scenario())
    assert supervisor.gave_up is None and child.alive and child.restarts == 1
    assert sum("restart 1 of 1" in event for event in supervisor.events) == 3
    supervisor.stop_all()


ESCAPER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
time.sleep(600)
"""


def test_descendants_in_a_session_of_their_own_die_with_the_child(tmp_path: Path) -> None:
    # like vLLM under `evoenv serve`: a grandchild outside the child's process group, which a
    # kill of that group does not reach; it must not outlive the child (it would hold its port)
    child = Child("escaper", [sys.executable, "-c", ESCAPER], dict(os.environ), tmp_path / "e.log")
    supervisor = Supervisor()
    supervisor.add(child)

    async def scenario() -> set[int]:
        stop = asyncio.Event()
        child.start()
        watcher = asyncio.create_task(supervisor.watch(stop))
        deadline = time.monotonic() + 20
        while not child.tree and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        escaped = set(child.tree)
        os.killpg(_command_pid(child), signal.SIGKILL)
        while child.restarts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await watcher
        return escaped

    escaped = asyncio.run(scenario())
    assert len(escaped) == 2  # the command and its grandchild in a session of its own
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in escaped) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in escaped), "the grandchild outlived its parent"
    supervisor.stop_all()
    assert not any(_alive(pid) for pid in child.tree)


SLOW_TO_STOP = """
import signal, sys, time
def stop(*_):
    time.sleep(float(sys.argv[1]))
    with open(sys.argv[2], "w") as out:
        out.write(repr(time.time()))
    raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2] + ".ready", "w").close()
time.sleep(600)
"""


def test_stop_all_stops_a_layer_together_and_the_layers_in_order(tmp_path: Path) -> None:
    # Two workers (layer 1) that take 2 s each to exit on SIGTERM, and the service they use
    # (layer 0): the workers stop together (about 2 s, not 4), the service only after both.
    def child(name: str, layer: int, seconds: float) -> Child:
        argv = [sys.executable, "-c", SLOW_TO_STOP, str(seconds), str(tmp_path / name)]
        return Child(name, argv, dict(os.environ), tmp_path / f"{name}.log", layer=layer, grace=10)

    supervisor = Supervisor()
    service = supervisor.add(child("service", 0, 0.0))
    workers = [supervisor.add(child(f"worker{k}", 1, 2.0)) for k in range(2)]
    for each in supervisor.children:
        each.start()
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"{c.name}.ready").exists() for c in supervisor.children):
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.05)
    pids = [c.proc.pid for c in supervisor.children]  # type: ignore[union-attr]

    started = time.time()
    supervisor.stop_all()
    took = time.time() - started

    stopped = {c.name: float((tmp_path / c.name).read_text()) for c in supervisor.children}
    assert 2.0 <= took < 3.5, f"stop_all took {took:.1f} s: the workers were not stopped together"
    assert stopped[service.name] >= max(stopped[w.name] for w in workers)
    assert not any(_alive(pid) for pid in pids)


SUPERVISING = """
import os, sys, time
from pathlib import Path
from evoenv_cli.supervisor import Child, Supervisor, descendants
folder = Path(sys.argv[1])
supervisor = Supervisor()
for name, code in (("service", "import time; time.sleep(600)"), ("worker", sys.argv[2])):
    argv = [sys.executable, "-c", code]
    child = supervisor.add(Child(name, argv, dict(os.environ), folder / f"{name}.log", grace=2))
    child.start()
time.sleep(1.0)  # the worker's grandchild starts
pids = {c.proc.pid for c in supervisor.children} | descendants(os.getpid())
(folder / "pids.tmp").write_text(" ".join(map(str, pids)))
(folder / "pids.tmp").rename(folder / "pids")
time.sleep(600)
"""


STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a worker whose broker is gone
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
time.sleep(600)
"""


def test_children_stop_when_the_supervising_process_is_killed(tmp_path: Path) -> None:
    # `kill -9` of `evoenv up` (or its death by SIGHUP before it can stop anything) must not
    # leave a Redis, a vLLM server or a worker behind: each child is in a session of its own,
    # which no signal to the supervisor's group reaches, so the kernel's parent-death signal
    # stops each child's reaper, which stops the child and, after its grace (2 s here), kills
    # what is left: a child that ignores SIGTERM, and its grandchild in a session of its own.
    supervising = subprocess.Popen(
        [sys.executable, "-c", SUPERVISING, str(tmp_path), STUBBORN], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "pids").exists():
            assert time.monotonic() < deadline and supervising.poll() is None, "no children"
            time.sleep(0.05)
        pids = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
        # two reapers, their two commands, the worker's grandchild in a session of its own
        assert len(pids) == 5 and all(_alive(pid) for pid in pids)
        os.kill(supervising.pid, signal.SIGKILL)
        supervising.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids), "a child outlived its supervisor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervising.pid, signal.SIGKILL)


def test_a_child_that_finishes_ends_the_watch_and_one_that_dies_is_said_why(
    tmp_path: Path,
) -> None:
    # The learner done with its steps exits 0: the run ends, nothing is restarted. A learner
    # killed by SIGKILL is restarted, its `died` hook told how it ended first.
    reasons: list[str] = []
    lines: list[str] = []
    finisher = Child(
        "learner",
        [sys.executable, "-c", "import sys, time; time.sleep(1.5); sys.exit(0)"],
        dict(os.environ),
        tmp_path / "learner.log",
        finishes=True,
        died=reasons.append,
        max_restarts=2,
    )
    victim = Child(
        "victim",
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        dict(os.environ),
        tmp_path / "victim.log",
        died=reasons.append,
        max_restarts=0,
    )
    supervisor = Supervisor(on_event=lines.append)
    supervisor.add(finisher)

    async def scenario(child: Child) -> None:
        stop = asyncio.Event()
        child.start()
        await asyncio.wait_for(supervisor.watch(stop), timeout=30)
        assert stop.is_set()

    asyncio.run(scenario(finisher))
    assert supervisor.finished == "learner" and finisher.restarts == 0 and not reasons

    supervisor = Supervisor(on_event=lines.append)
    supervisor.add(victim)
    asyncio.run(scenario(victim))
    assert reasons == ["was killed by SIGKILL"]
    assert supervisor.gave_up == "victim" and supervisor.gave_up_reason == reasons[0]
    assert lines == ["victim was killed by SIGKILL, after 0 restarts; giving up"]


def test_exit_reason_names_the_signal_and_the_out_of_memory_killer() -> None:
    assert exit_reason(0, set()) == "exited with status 0"
    assert exit_reason(3, set()) == "exited with status 3"
    assert exit_reason(-signal.SIGTERM, set()) == "was killed by SIGTERM"
    # the cgroup counted an out-of-memory kill since the child started
    counted = oom_kills()
    if counted is not None:
        assert exit_reason(-signal.SIGKILL, {1}, counted - 1).endswith(
            "(the kernel's out-of-memory killer)"
        )
        assert exit_reason(-signal.SIGKILL, {2**22 + 7}, counted) == "was killed by SIGKILL"
