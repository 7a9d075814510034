"""Fixtures of the sandbox tests: the real confined sandbox, and a benign environment.

Confined mode needs bubblewrap, Landlock ABI >= 6 and seccomp: where they are missing these
tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evoenv_cli.supervisor import descendants, process_parents
from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.sandbox.launch import missing_isolation
from evoenv_worker.sandbox.runner import SPARES, STARTED
from shared.config import SandboxSettings

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

BENIGN_SOURCE = """
import random

from shared.environment import Environment


class Doubling(Environment):
    name = "doubling"
    description = "Double a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 10 ** difficulty)}

    def solve(self, instance: dict) -> int:
        return 2 * instance["n"]

    def render(self, instance: dict) -> str:
        return f"What is twice {instance['n']}? Answer with the number."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        return 1.0 if answer.strip() == str(reference) else 0.0
"""
"""A tiny well-behaved environment for the "the sandbox still works" checks."""


def require_isolation() -> None:
    problems = missing_isolation()
    if problems:
        message = "confined sandbox unavailable: " + "; ".join(problems)
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def _is_runner(pid: int) -> bool:
    """Whether `pid` is the fork server or one of its children (Python running runner.py)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return "python" in Path(argv[0].decode(errors="replace")).name and any(
        arg.endswith(b"runner.py") for arg in argv
    )


@pytest.fixture
def sandbox_processes() -> Callable[[Sandbox], tuple[int, list[int]]]:
    """A function giving the host pid of a sandbox (its bubblewrap; -1 if none runs) and the
    pids of the processes below it that stay from call to call: all but the fork server's
    children. Between calls the server's children are the ones forked for later requests (at
    most `SPARES` waiting, forked a few at a time, plus `STARTED` getting ready, each one
    serving one request); the children a call killed are reaped as they finish dying. It fails if the server has more children than
    that a second later (a process of an earlier call lives on) or if one of them is dead (a
    call reached it)."""

    def processes(sandbox: Sandbox) -> tuple[int, list[int]]:
        proc = sandbox._proc
        if proc is None or proc.poll() is not None:
            return -1, []
        deadline = time.monotonic() + 1.0
        while True:
            parents = process_parents()
            below = descendants(proc.pid, parents=parents)
            servers = {p for p in below if _is_runner(p) and not _is_runner(parents[p])}
            children = [c for c in below if parents[c] in servers]
            dead = [c for c in children if _state(c) in ("Z", "X", "")]
            settled = len(children) <= (SPARES + STARTED) * len(servers) and not dead
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert len(children) <= (SPARES + STARTED) * len(servers), f"the server has {children}"
        assert not dead, f"the children {dead} died waiting for their requests"
        return proc.pid, sorted(set(below) - set(children))

    return processes


def _state(pid: int) -> str:
    """The one-letter state of `pid` (Z: a zombie), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.fixture(scope="module")
def confined_settings() -> SandboxSettings:
    require_isolation()
    return SandboxSettings(op_seconds=2.0, memory_mb=512)


@pytest.fixture(scope="module")
def sandbox(confined_settings: SandboxSettings) -> Iterator[Sandbox]:
    with Sandbox(confined_settings) as started:
        yield started


@pytest.fixture
def benign_source() -> str:
    return BENIGN_SOURCE


@pytest.fixture
def check_benign() -> Callable[[Sandbox], None]:
    """A function asserting that `sandbox` still runs the benign environment correctly."""

    def check(sandbox: Sandbox) -> None:
        results = sandbox.run(
            BENIGN_SOURCE,
            [
                {"op": "describe"},
                {"op": "instance", "seed": 7, "difficulty": 2},
                {"op": "score", "answer": "-1", "from": 1},
            ],
        )
        assert [r.ok for r in results] == [True, True, True], results
        assert results[0].value["name"] == "doubling"
        instance = results[1].value
        assert instance["reference"] == 2 * instance["instance"]["n"]
        assert results[2].value == 0.0
        [right] = sandbox.run(
            BENIGN_SOURCE,
            [
                {
                    "op": "score",
                    "answer": instance["answer_text"],
                    "instance": instance["instance"],
                    "reference": instance["reference"],
                }
            ],
        )
        assert right.ok and right.value == 1.0, right

    return check
