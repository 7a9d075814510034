"""Fixtures shared by the whole suite.

Services: tests that need Redis get a private `redis-server` (append-only on, data in a temp
folder) started once per session and flushed per test. Under `CI=true` a missing service is a
failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import hypothesis
import pytest
from support import IN_CI, free_port, missing

REPO = Path(__file__).resolve().parents[1]
SEEDS_DIR = REPO / "seeds"


class RedisServer:
    """A private redis-server process; `restart()` keeps its append-only data."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def restart(self, down: float = 0.0, kill: bool = False) -> None:
        """Stop (SIGKILL with `kill`), stay down `down` seconds, start again on the same port
        and data."""
        if kill and self.proc is not None:
            self.proc.kill()
        self.stop()
        time.sleep(down)
        self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (scripts/setup.sh installs it)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean Redis database for one test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


# Hypothesis (the fuzz tests): derandomised under CI, so a run is reproducible and its time
# known; random on a developer's machine. No example database is written either way.
hypothesis.settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, max_examples=100
)
hypothesis.settings.register_profile("dev", database=None, deadline=None, max_examples=100)
hypothesis.settings.load_profile("ci" if IN_CI else "dev")


def pytest_report_header() -> str:
    """The CPU the run drew (its kind sets the end-to-end tests' sizes: tests/e2e)."""
    from shared.hardware import NATIVE_BF16_FLAGS, cpu_flags, cpu_model_name

    native = sorted(cpu_flags() & NATIVE_BF16_FLAGS)
    return f"CPU: {cpu_model_name()}, native bfloat16: {', '.join(native) if native else 'no'}"


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Write the test about to run to EVOENV_CURRENT_TEST_FILE, where `scripts/test.sh` set it:
    a run stopped at the suite's time budget names the test it was in."""
    path = os.environ.get("EVOENV_CURRENT_TEST_FILE")
    if path:
        Path(path).write_text(nodeid + "\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared end-to-end cluster (`tests/e2e/conftest.py`) run last, together:
    the cluster starts once, after every test that starts a large server of its own. The
    learning test goes first among them: its time budget (docs/development.md) counts the
    cluster's start."""

    def order(item: pytest.Item) -> tuple[bool, bool]:
        on_cluster = "cluster" in getattr(item, "fixturenames", ())
        return on_cluster, item.module is None or item.module.__name__ != "test_it_learns"

    items.sort(key=order)


CLAIMS = pytest.StashKey[list[str]]()
"""Measured lines that tests hand to the terminal summary."""


@pytest.fixture
def claim(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print a measured line (e.g. the learning test's result) in pytest's terminal summary,
    where it shows without `-s`, passed or failed; also on the test's own output."""
    lines = request.config.stash.setdefault(CLAIMS, [])

    def add(line: str) -> None:
        print(line)
        lines.append(line)

    return add


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(CLAIMS, [])
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)
