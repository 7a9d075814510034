"""verifiers for the tests of `evoenv pool export --format verifiers`: each pinned version's
private folder (scripts/setup.sh makes them), the export installed beside it by pip, and client
processes that run with that folder on their path and fail on any connection beyond loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import missing

REPO = Path(__file__).resolve().parents[1]
FOLDERS = REPO / ".cache" / "evoenv" / "verifiers"
LEGACY, V1 = "0.3.1", "0.4.0"
"""verifiers 0.3.1 (its `verifiers.legacy` API) and 0.4.0 (v1 only)."""

OFFLINE = """
import sys

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def _loopback_only(event, args):
    # Connections to anything but loopback fail the client: nothing may be fetched at run time.
    if event == "socket.connect" and isinstance(args[1], tuple) and args[1][0] not in _LOOPBACK:
        raise RuntimeError(f"a connection to {args[1]!r}: the tests run offline")
    if event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if host not in _LOOPBACK and host not in (None, ""):
            raise RuntimeError(f"a name lookup of {host!r}: the tests run offline")


sys.addaudithook(_loopback_only)
"""
"""Prepended to every client's code."""


def folder(version: str) -> Path:
    """The private folder of verifiers `version`; `missing` when setup has not made it."""
    path = FOLDERS / version
    if not (path / ".evoenv-complete").is_file():
        missing(f"verifiers {version} is not set up in {path} (scripts/setup.sh makes it)")
    return path


def client_env(version: str, site: Path, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a client of verifiers `version`: the installed export and the
    version's folder on the path (the project's venv below them), a private home (verifiers
    0.4.0 keeps its runtimes' folders there) and, for 0.4.0, its uv and the wheels of the chat
    program each rollout runs, with no index."""
    vf = folder(version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVOENV_", "PYTHON", "UV_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(vf)]),
        HOME=str(home),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    if version == V1:
        env.update(
            PATH=os.pathsep.join([str(vf / "bin"), env.get("PATH", "")]),
            UV_NO_INDEX="1",
            UV_FIND_LINKS=str(vf / "wheels"),
            UV_PYTHON=sys.executable,
            UV_PYTHON_DOWNLOADS="never",
            UV_CACHE_DIR=str(home / "uv"),
        )
    env.update(extra)
    return env


def start(code: str, env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    """A client process running `code` (after `OFFLINE`) with `args`."""
    return subprocess.Popen(
        [sys.executable, "-c", OFFLINE + code, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str], timeout: float) -> Any:
    """The JSON a client printed last; the test fails with the end of its stderr otherwise."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the client ran past {timeout:g} s:\n{stderr[-4000:]}") from None
    assert proc.returncode == 0, stderr[-6000:]
    return json.loads(stdout.strip().splitlines()[-1])
