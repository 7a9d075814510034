"""Every attack of the threat model (docs/SANDBOX.md#threat-model), run through the real
confined sandbox.

One environment file per attack in tests/corpus/hostile/. Each attack runs in the routine the
test calls and reports a perfect score if it ever gets through. For every attack: the call
fails with the expected kind within its limit, the host saw nothing (no connection, no file,
no secret in the reply), the fork server survived, and a benign call afterwards is correct.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import select
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.sandbox.launch import CONFINE, PROJECT_ROOT, RUNNER
from shared.config import SandboxSettings

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "hostile"
SCORE_OP = {"op": "score", "answer": "1", "instance": {"n": 1}, "reference": 1}
INSTANCE_OP = {"op": "instance", "seed": 1, "difficulty": 1}

EXPECTED: dict[str, tuple[set[str] | None, str]] = {
    # attack: (kinds the call may fail with, a snippet its error must contain)
    "infinite_loop": ({"timeout"}, "no result within"),
    "memory_bomb": ({"memory"}, "out of memory"),
    "fork_bomb": ({"exception"}, "Operation not permitted"),
    "fork_plain": ({"exception"}, "Operation not permitted"),
    "exec_subprocess": ({"exception"}, "Operation not permitted"),
    "tcp_connect": ({"exception"}, "Operation not permitted"),
    "udp_send": ({"exception"}, "Operation not permitted"),
    "unix_socket": ({"exception"}, "Operation not permitted"),
    "read_secrets": ({"exception"}, "nothing readable"),
    "write_outside": ({"exception"}, "PermissionError"),
    "flood_output": ({"output"}, "larger than"),
    "c_stack_overflow": ({"crash"}, "SIGSEGV"),
    "ctypes_syscalls": ({"exception"}, "'clone3': 'Function not implemented'"),
    "x32_syscall": ({"crash"}, "SIGSYS"),
    "int80_syscall": ({"crash"}, "SIGSYS"),
    "kill_everyone": ({"exception"}, "kill(parent): PermissionError"),
    "kill_group": ({"crash"}, "SIGKILL"),
    "cripple_server": ({"exception"}, "nofile: PermissionError"),
    "close_and_linger": ({"crash"}, "SIGKILL"),
    "outlive_request": ({"exception"}, "lingering after the last result"),
    # A child may forge the results of its own request (it is the code being judged); what
    # must hold is that later requests are unaffected, which the benign check verifies.
    "forge_results": (None, ""),
}
INSTANCE_ATTACKS = {"flood_output"}


@dataclass
class HostTargets:
    """What the attacks aim at on the host, and how to tell whether they reached it."""

    secret: str
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    abstract: socket.socket
    abstract_name: str
    markers: list[Path]
    protected: dict[Path, str]

    def substitutions(self) -> dict[str, str]:
        return {
            "TCP_PORT": str(self.tcp.getsockname()[1]),
            "UDP_PORT": str(self.udp.getsockname()[1]),
            "UNIX_PATH": repr(self.unix.getsockname()),
            "ABSTRACT_NAME": repr(self.abstract_name),
            "MARKERS": repr([str(path) for path in self.markers]),
        }

    def assert_untouched(self) -> None:
        for listener in (self.tcp, self.unix, self.abstract, self.udp):
            ready, _, _ = select.select([listener], [], [], 0)
            assert not ready, f"the sandbox reached {listener}"
        for path in self.markers:
            assert not path.exists(), f"the sandbox wrote {path}"
        for path, digest in self.protected.items():
            assert _digest(path) == digest, f"the sandbox changed {path}"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listener(family: int, kind: int, address: Any) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen()
    sock.setblocking(False)
    return sock


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostTargets]:
    token = uuid.uuid4().hex
    folder = tmp_path_factory.mktemp("hostile")
    secret = f"evoenv-secret-{token}"
    os.environ["EVOENV_TEST_SECRET"] = secret  # before the sandbox starts
    abstract_name = f"\0evoenv-hostile-{token}"
    found = HostTargets(
        secret=secret,
        tcp=_listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
        udp=_listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)),
        unix=_listener(socket.AF_UNIX, socket.SOCK_STREAM, str(folder / "host.sock")),
        abstract=_listener(socket.AF_UNIX, socket.SOCK_STREAM, abstract_name),
        abstract_name=abstract_name,
        markers=[Path(f"/tmp/evoenv-hostile-{token}"), PROJECT_ROOT / f"evoenv-hostile-{token}"],
        protected={
            path: _digest(path)
            for path in (RUNNER, CONFINE, PROJECT_ROOT / "shared/environment.py")
        },
    )
    yield found
    for sock in (found.tcp, found.udp, found.unix, found.abstract):
        sock.close()
    del os.environ["EVOENV_TEST_SECRET"]


@pytest.fixture(scope="module")
def hostile_sandbox(targets: HostTargets, confined_settings: SandboxSettings) -> Iterator[Sandbox]:
    """Started after `targets`, so the secret is in the host's environment when it starts."""
    with Sandbox(confined_settings) as sandbox:
        yield sandbox


def attack_source(name: str, targets: HostTargets) -> str:
    source = (CORPUS / f"{name}.py").read_text()
    for constant, value in targets.substitutions().items():
        line = f"{constant} = {value}"
        source = re.sub(rf"^{constant} = .*$", lambda _: line, source, flags=re.M)  # noqa: B023
    return source


def test_every_attack_file_has_an_expectation() -> None:
    assert {path.stem for path in CORPUS.glob("*.py")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_attack_is_contained(
    name: str,
    hostile_sandbox: Sandbox,
    targets: HostTargets,
    check_benign: Callable[[Sandbox], None],
    sandbox_processes: Callable[[Sandbox], tuple[int, list[int]]],
) -> None:
    kinds, snippet = EXPECTED[name]
    before = sandbox_processes(hostile_sandbox)
    op = INSTANCE_OP if name in INSTANCE_ATTACKS else SCORE_OP

    start = time.monotonic()
    [result] = hostile_sandbox.run(attack_source(name, targets), [op], filename=f"{name}.py")
    elapsed = time.monotonic() - start

    if kinds is not None:
        assert not result.ok, f"{name} got through: {result}"
        assert result.kind in kinds, result
        assert snippet in result.error, result
    assert elapsed < hostile_sandbox.settings.op_seconds + 3.0
    assert targets.secret not in repr(result)
    targets.assert_untouched()
    assert sandbox_processes(hostile_sandbox) == before, (
        "the server died or a process outlived the call"
    )
    assert hostile_sandbox.restarts == 0
    check_benign(hostile_sandbox)


def test_forged_results_stay_in_their_request(
    hostile_sandbox: Sandbox, targets: HostTargets, benign_source: str
) -> None:
    """The forger's patches die with its child: the next request's scores are real."""
    hostile_sandbox.run(attack_source("forge_results", targets), [SCORE_OP, SCORE_OP])
    ops = [
        {"op": "score", "answer": answer, "instance": {"n": 1}, "reference": 2}
        for answer in ("1", "2")
    ]
    results = hostile_sandbox.run(benign_source, ops)
    assert [(r.ok, r.value) for r in results] == [(True, 0.0), (True, 1.0)]


def test_the_sandbox_environment_holds_no_host_variable(hostile_sandbox: Sandbox) -> None:
    source = (CORPUS / "read_secrets.py").read_text()
    [result] = hostile_sandbox.run(source, [SCORE_OP])
    environ = re.search(r"'environ': (\{[^}]*\})", result.error)
    assert environ is not None, result
    assert set(ast.literal_eval(environ.group(1))) <= {
        "PYTHONHASHSEED",
        "MALLOC_ARENA_MAX",
        "LC_ALL",
        "LC_CTYPE",
        "HOME",
        "TMPDIR",
        "PWD",
    }
