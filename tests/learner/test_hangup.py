"""A learner (or `evoenv up`) whose terminal closes stops as on Ctrl-C, whether a SIGHUP reaches
it or not; writes that would fail with EIO on the hung-up terminal go to /dev/null instead.
Real processes on a real pseudo-terminal."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HANGS_UP = """
import asyncio, signal, sys
from evoenv_learner.loop import hangup_handler, watch_terminal

if sys.argv[1] == "nohup":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


async def main() -> None:
    stop = asyncio.Event()
    handler = hangup_handler(stop.set)
    if handler is None:
        print("ignored", flush=True)
        return
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, handler)
    watcher = asyncio.create_task(watch_terminal(handler))
    print("ready", flush=True)
    await stop.wait()
    watcher.cancel()
    for _ in range(100):  # what a stopping learner prints: each would fail on the dead terminal
        print("stopping: writing a checkpoint", flush=True)
        print("a warning", file=sys.stderr, flush=True)
    with open(sys.argv[2], "w") as out:
        out.write("stopped cleanly")


asyncio.run(main())
"""


def _on_a_terminal(mode: str, marker: Path) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGS_UP, mode, str(marker)],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


def _read_line(master: int, timeout: float = 60.0) -> str:
    text = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in text and time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            text += os.read(master, 1024)
    return text.decode().strip()


@pytest.mark.parametrize("signalled", [True, False], ids=["sighup", "no-signal"])
def test_a_closed_terminal_stops_it_cleanly_and_later_output_is_dropped(
    tmp_path: Path, signalled: bool
) -> None:
    # with no SIGHUP (the session leader got it, as make under `ssh -t`), the watcher notices
    marker = tmp_path / "stopped"
    proc, master = _on_a_terminal("terminal", marker)
    try:
        assert _read_line(master) == "ready"
        os.close(master)  # the terminal goes away: its side is hung up
        if signalled:
            proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == "stopped cleanly"


def test_under_nohup_a_hangup_stays_ignored(tmp_path: Path) -> None:
    proc, master = _on_a_terminal("nohup", tmp_path / "stopped")
    try:
        assert _read_line(master) == "ignored"
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
