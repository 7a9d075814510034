"""The sandbox's ordinary behaviour: operations, limits, recovery, leaks, and how it starts.

These run the real confined sandbox; only the tests about refusing to start, the unconfined
mode and the host's backstop replace a piece (the isolation check, the server command).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing

from evoenv_worker.sandbox import confine, host, launch
from evoenv_worker.sandbox.host import Sandbox
from shared.config import SandboxSettings
from shared.environment import Environment, make_rng, seed_global_random
from shared.errors import SandboxFailure, SandboxUnavailable

REPO = Path(__file__).resolve().parents[2]

TOOLS_SOURCE = '''
import os
import random

from shared.environment import Environment


class Tools(Environment):
    """Its scorer does what the answer says: loop, allocate, crash, start threads, hash."""

    name = "tools"
    description = "A scorer that follows orders."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"hash": hash("evoenv"), "n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return "Give an order."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        order, _, amount = answer.partition(" ")
        if order == "loop":
            while True:
                pass
        if order == "allocate":
            block = bytearray(int(amount) << 20)
            return float(len(block) > 0)
        if order == "abort":
            os.abort()
        if order == "threads":
            import threading
            import time

            threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(int(amount))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return 1.0
'''


def order(text: str) -> dict[str, object]:
    return {"op": "score", "answer": text, "instance": {}, "reference": 0}


def load_seed(name: str) -> Environment:
    spec = importlib.util.spec_from_file_location(f"seed_{name}", REPO / "seeds" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [cls] = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Environment) and v is not Environment
    ]
    return cls()


# ----------------------------------------------------------------------------- confined


def test_the_server_reports_its_confinement(
    sandbox: Sandbox, confined_settings: SandboxSettings
) -> None:
    status = sandbox.confinement
    assert sandbox.isolated and status["isolated"] is True
    assert status["landlock_abi"] >= confine.MIN_LANDLOCK_ABI
    assert status["seccomp"] and status["no_new_privs"] and status["scoped"]
    expected_uid = confined_settings.uid if os.geteuid() == 0 else os.getuid()
    assert status["uid"] == expected_uid != 0


def test_ops_match_the_seed_run_in_process(sandbox: Sandbox) -> None:
    seed = load_seed("sort_words")
    source = (REPO / "seeds" / "sort_words.py").read_text()
    ops: list[dict[str, object]] = [{"op": "describe"}]
    for s in range(3):
        ops.append({"op": "instance", "seed": s, "difficulty": 4})
        ops.append({"op": "score", "answer": "wrong", "from": len(ops) - 1})
    results = sandbox.run(source, ops)
    assert all(r.ok for r in results), results
    assert results[0].value["name"] == "sort_words"
    for s in range(3):
        seed_global_random("sort_words", s, 4)
        instance = seed.sample(make_rng("sort_words", s, 4), 4)
        value = results[1 + 2 * s].value
        assert value["instance"] == instance
        assert value["reference"] == seed.solve(instance)
        assert value["prompt"] == seed.render(instance)
        assert results[2 + 2 * s].value == 0.0
        [right] = sandbox.run(
            source,
            [
                {
                    "op": "score",
                    "answer": value["answer_text"],
                    "instance": instance,
                    "reference": value["reference"],
                }
            ],
        )
        assert right.ok and right.value == 1.0


def hash_with_seed_zero(text: str) -> int:
    """`hash(text)` in a Python started with PYTHONHASHSEED=0."""
    done = subprocess.run(
        [sys.executable, "-c", f"print(hash({text!r}))"],
        check=True,
        env={"PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_the_hash_seed_is_fixed(sandbox: Sandbox) -> None:
    [result] = sandbox.run(TOOLS_SOURCE, [{"op": "instance", "seed": 1, "difficulty": 1}])
    assert result.value["instance"]["hash"] == hash_with_seed_zero("evoenv")


def test_a_timeout_leaves_the_other_ops_running(sandbox: Sandbox) -> None:
    start = time.monotonic()
    results = sandbox.run(TOOLS_SOURCE, [order("loop"), order("ok"), order("ok")])
    assert [r.kind for r in results] == ["timeout", "", ""]
    assert [r.value for r in results[1:]] == [1.0, 1.0]
    assert time.monotonic() - start < sandbox.settings.op_seconds + 2.0


def test_memory_limit(sandbox: Sandbox) -> None:
    results = sandbox.run(TOOLS_SOURCE, [order("allocate 64"), order("allocate 4096")])
    assert results[0].ok and results[0].value == 1.0
    assert not results[1].ok and results[1].kind == "memory"


def test_threads_fit_in_the_memory_limit(sandbox: Sandbox) -> None:
    """1 MiB thread stacks and two malloc arenas: 100 threads fit in a 512 MiB limit."""
    [result] = sandbox.run(TOOLS_SOURCE, [order("threads 100")])
    assert result.ok, result


def test_a_crashed_child_and_a_killed_server_are_recovered(
    sandbox: Sandbox, sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]]
) -> None:
    results = sandbox.run(TOOLS_SOURCE, [order("abort"), order("ok")])
    assert [(r.kind, r.value) for r in results] == [("crash", None), ("", 1.0)]
    assert "SIGABRT" in results[0].error
    pid, _ = sandbox_processes(sandbox)
    fds = len(os.listdir("/proc/self/fd"))
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while sandbox_processes(sandbox)[0] != -1:  # dead between calls, then restarted by run
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [after] = sandbox.run(TOOLS_SOURCE, [order("ok")])
    assert after.ok
    assert sandbox_processes(sandbox)[0] not in (pid, -1)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_thousand_calls_leak_no_process_or_descriptor(
    sandbox: Sandbox, sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]]
) -> None:
    sandbox.run(TOOLS_SOURCE, [order("ok")])
    fds = len(os.listdir("/proc/self/fd"))
    processes = sandbox_processes(sandbox)
    restarts = sandbox.restarts
    for _ in range(1000):
        [result] = sandbox.run(TOOLS_SOURCE, [order("ok")])
        assert result.ok
    assert len(os.listdir("/proc/self/fd")) == fds
    assert sandbox_processes(sandbox) == processes
    assert sandbox.restarts == restarts


def test_closing_leaves_no_process(
    confined_settings: SandboxSettings,
    sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]],
) -> None:
    sandbox = Sandbox(confined_settings)
    sandbox.start()
    pid, inside = sandbox_processes(sandbox)
    assert len(inside) >= 2  # bubblewrap's init, the fork server
    sandbox.close()
    deadline = time.monotonic() + 5.0
    while any(Path(f"/proc/{p}").exists() for p in [pid, *inside]):
        assert time.monotonic() < deadline, "sandbox processes outlived close()"
        time.sleep(0.05)


def test_the_confined_command_binds_only_what_it_needs(
    confined_settings: SandboxSettings,
) -> None:
    argv, env, isolated = launch.server_command(confined_settings, hash_seed=0)
    assert isolated and env == {}
    assert Path(argv[0]).name == "bwrap"
    for flag in (
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in argv
    sources = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"]
    assert str(REPO) not in sources and str(REPO / ".venv") not in sources
    assert not any(src.startswith(str(REPO / ".venv")) for src in sources)
    project = sorted(src for src in sources if src.startswith(str(REPO)))
    assert project == sorted(
        str(p)
        for p in (
            launch.RUNNER,
            launch.CONFINE,
            REPO / "shared/__init__.py",
            REPO / "shared/environment.py",
        )
    )
    assert argv[-3:] == [f"{confine.ROOT}/sandbox/runner.py", confine.ROOT, "--confine"]
    if os.geteuid() == 0:
        assert f"--reuid={confined_settings.uid}" in argv and "--bounding-set=-all" in argv


# ----------------------------------------------------------------------------- start-up


def test_the_filter_is_refused_on_other_architectures() -> None:
    assert len(confine.build_filter("x86_64")) % 8 == 0
    with pytest.raises(confine.ConfinementError, match="x86_64 only"):
        confine.build_filter("aarch64")


def test_missing_isolation_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_verified_uids", set())
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    monkeypatch.setattr(launch.confine, "landlock_abi", lambda: 3)
    text = "; ".join(launch.missing_isolation())
    assert "apt-get install bubblewrap" in text
    assert "Landlock ABI 3" in text
    if os.geteuid() == 0:
        assert "apt-get install util-linux" in text


def test_refuses_to_start_without_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        launch,
        "missing_isolation",
        lambda uid=0: ["bubblewrap is missing: apt-get install bubblewrap"],
    )
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as caught:
        Sandbox(SandboxSettings()).start()
    assert "EVOENV_SANDBOX__ALLOW_UNCONFINED" in str(caught.value)


def test_unconfined_mode_says_it_is_not_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "missing_isolation", lambda uid=0: ["no bubblewrap"])
    with (
        structlog.testing.capture_logs() as logs,
        Sandbox(SandboxSettings(allow_unconfined=True)) as sandbox,
    ):
        [result] = sandbox.run(TOOLS_SOURCE, [{"op": "instance", "seed": 1, "difficulty": 1}])
        assert sandbox.isolated is False
        assert sandbox.confinement == {"isolated": False}
    assert result.ok and result.value["instance"]["hash"] == hash_with_seed_zero("evoenv")
    events = {log["event"] for log in logs}
    assert {"sandbox_unconfined", "sandbox_not_isolated"} <= events


def test_the_host_kills_a_server_that_stops_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = [
        sys.executable,
        "-c",
        "import time; print('{\"ready\": true}', flush=True); time.sleep(60)",
    ]
    monkeypatch.setattr(host, "server_command", lambda settings, hash_seed: (hung, {}, False))
    monkeypatch.setattr(host, "_SLACK_SECONDS", 0.5)
    sandbox = Sandbox(SandboxSettings(op_seconds=0.5, allow_unconfined=True))
    sandbox.start()
    first = sandbox._proc
    assert first is not None
    start = time.monotonic()
    with pytest.raises(SandboxFailure, match="deadline"):
        sandbox.run(TOOLS_SOURCE, [order("ok")])
    assert time.monotonic() - start < 5.0
    assert first.poll() is not None
    assert sandbox.restarts == 2
