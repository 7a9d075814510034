"""What the benchmarks share: a private Redis, a logged subprocess, a trusted environment file
loaded in-process. Benchmarks run as scripts (`python bench/bench_x.py`), so this folder is on
their import path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shared.environment import Environment  # noqa: E402
from shared.ports import free_port  # noqa: E402


def private_redis(folder: Path, *, append_only: bool) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a free port with its data in `folder`; returns it and its URL once it
    answers PING."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--appendonly", "yes" if append_only else "no", "--save", "", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, url


def start_process(
    command: list[str], env: dict[str, str], log: Path, *, append: bool = False
) -> subprocess.Popen[bytes]:
    """`command` in its own session (so its whole group can be killed), output to `log`."""
    with log.open("ab" if append else "wb") as sink:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def load_environment(path: Path, module_name: str = "bench_candidate") -> Environment:
    """An instance of the one Environment subclass in `path` (trusted code: seeds, bench files)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [cls] = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Environment) and v is not Environment
    ]
    return cls()
