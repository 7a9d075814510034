"""`evoenv serve` as a process: killing it with SIGKILL takes the vLLM server down with it.

The server runs in a session of its own (so it can be stopped as a group), out of reach of a
kill of its starter's group; it must still not outlive its starter (it would keep its port,
and a restarted `evoenv serve` would fail with "address already in use")."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import CACHE
from fake_vllm import free_port

from evoenv_cli.supervisor import descendants
from evoenv_model.models import TEST_MODEL

pytestmark = pytest.mark.slow


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_sigkill_of_evoenv_serve_takes_the_server_with_it(
    small_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")},
        "EVOENV_MODEL": TEST_MODEL,
        "EVOENV_DATA_DIR": str(CACHE),
        "EVOENV_SERVE__KV_CACHE_GIB": "1",
        "EVOENV_SERVE__MAX_MODEL_LEN": "2048",
    }
    with (tmp_path / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from evoenv_cli import main; main()",
                "serve",
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server_tree: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became healthy"
            time.sleep(1)
        server_tree |= descendants(proc.pid)
        assert server_tree, "evoenv serve runs the server as a child process"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while (descendants_alive := {p for p in server_tree if Path(f"/proc/{p}").exists()}) or (
            not _port_free(port)
        ):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"left running after kill -9 of evoenv serve: {sorted(descendants_alive)}"
                )
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in server_tree | descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
