"""`evoenv serve` as a process: killing it with SIGKILL takes the vLLM server down with it.

The server runs in a session of its own (so it can be stopped as a group), out of reach of a
kill of its starter's group; it must still not outlive its starter (it would keep its port,
and a restarted `evoenv serve` would fail with "address already in use").

The process is the session's `evoenv serve` (`serve_process`), which the log-prob test asked
in bfloat16 before this module ran (started here if it is not running)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from model_support import ServeProcess

from evoenv_cli.supervisor import descendants

pytestmark = pytest.mark.slow


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_sigkill_of_evoenv_serve_takes_the_server_with_it(serve_process: ServeProcess) -> None:
    proc = serve_process.running()
    server_tree = descendants(proc.pid)
    assert server_tree, "evoenv serve runs the server as a child process"
    assert not _port_free(serve_process.port)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while (alive := {p for p in server_tree if Path(f"/proc/{p}").exists()}) or (
        not _port_free(serve_process.port)
    ):
        if time.monotonic() > deadline:
            pytest.fail(f"left running after kill -9 of evoenv serve: {sorted(alive)}")
        time.sleep(0.5)
