"""The host side of the sandbox: start the fork server, send requests, read untrusted replies.

One `Sandbox` is one long-lived fork server (see `runner.py`), started confined (see
`launch.py`) and restarted when it dies. `Sandbox.run` sends a batch of operations on one
environment source and returns one `OpResult` per operation. Every failure of environment code
(a raise, a timeout, running out of memory, a crash, an oversized or malformed result) comes
back as a failed `OpResult`, never as an exception; exceptions (`SandboxUnavailable`,
`SandboxFailure`) mean the sandbox itself could not do its job.

What the host does not trust: anything the server writes. Replies are size-capped, parsed and
checked against the expected shape and order. The server checks only how an op's result line
begins (`{"i":N,"ok":`) and relays the rest, the environment's process's own text, unparsed: a
line that begins so but is not that op's result as one JSON object fails that op ("output").
Anything else ends the server.
"""

from __future__ import annotations

import json
import marshal
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from evoenv_worker.sandbox.launch import server_command
from evoenv_worker.sandbox.runner import REQUEST_HEADER_BYTES, RESULT_PREFIX
from shared.config import SandboxSettings
from shared.errors import SandboxFailure, SandboxUnavailable

log = structlog.get_logger(__name__)

_SLACK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class OpResult:
    """What one operation gave. `kind` says how a failed one failed."""

    ok: bool
    value: Any = None
    kind: str = ""
    """exception, type, value, timeout, memory, crash, output, load, dependency or skipped."""
    routine: str = ""
    error: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return self.error or self.kind


class Sandbox:
    """A confined fork server for environment code. One request at a time (a lock guards it)."""

    def __init__(self, settings: SandboxSettings, *, hash_seed: int = 0) -> None:
        self.settings = settings
        self.hash_seed = hash_seed
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self.isolated = True
        self.confinement: dict[str, Any] = {}
        self.restarts = 0

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the fork server unless it is running; raise `SandboxUnavailable` if it cannot."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._kill()  # a server that died between calls: reap it and close its pipes
        argv, env, self.isolated = server_command(self.settings, hash_seed=self.hash_seed)
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start the sandbox ({argv[0]}): {exc}") from exc
        self._buffer = b""
        deadline = time.monotonic() + self.settings.start_seconds
        try:
            hello = self._read_message(deadline)
        except SandboxFailure as exc:
            self._kill()
            raise SandboxUnavailable(f"the sandbox did not start: {exc}") from exc
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            self._kill()
            raise SandboxUnavailable(
                f"the sandbox did not start: unexpected greeting {hello!r:.200}"
            )
        self.confinement = hello.get("confinement") or {}
        if not self.isolated:
            log.warning("sandbox_not_isolated", detail="environment code runs WITHOUT isolation")

    def close(self) -> None:
        with self._lock:
            self._kill()

    def run(
        self,
        source: str,
        ops: list[dict[str, Any]],
        *,
        filename: str = "environment.py",
        op_seconds: float | None = None,
    ) -> list[OpResult]:
        """Run `ops` on the environment in `source`; one result per op, in order.

        Ops hold JSON values only (see `_frame`); anything marshal cannot write is a TypeError
        before the request is sent.

        `op_seconds` (default: the settings' `op_seconds`) is the wall-clock limit of each op of
        this request, the CPU limit is that times the number of ops, and the host waits for the
        whole request that long plus a little. Pass a longer one for ops that do the work of
        many, such as a `grade` op scoring a group of answers (`grade.grade_op_seconds`): the
        limit applies to the whole op, and an op that overruns it fails as a whole.
        """
        if not ops:
            return []
        limits = {
            "op_seconds": op_seconds or self.settings.op_seconds,
            "memory_mb": self.settings.memory_mb,
            "output_bytes": self.settings.output_bytes,
        }
        request = _frame({"source": source, "filename": filename, "ops": ops, "limits": limits})
        with self._lock:
            for attempt in (1, 2):
                self.start()
                try:
                    return self._exchange(request, len(ops), limits["op_seconds"])
                except SandboxFailure as exc:
                    self._kill()
                    self.restarts += 1
                    log.warning("sandbox_restarted", reason=str(exc), attempt=attempt)
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------------------- internals

    def _exchange(self, request: bytes, n_ops: int, op_seconds: float) -> list[OpResult]:
        assert self._proc is not None and self._proc.stdin is not None
        deadline = time.monotonic() + n_ops * op_seconds + _SLACK_SECONDS
        try:
            self._proc.stdin.write(request)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SandboxFailure(f"the fork server is gone: {exc}") from exc
        results: list[OpResult] = []
        while True:
            line = self._read_line(deadline)
            if line.startswith(RESULT_PREFIX % len(results)):
                # The server checked only this beginning: the rest is the environment's.
                results.append(_to_result(_parse_result(line, len(results))))
                continue
            message = _parse(line)
            if not isinstance(message, dict) or message.get("done") is not True:
                raise SandboxFailure("reply out of order")
            break
        if len(results) != n_ops:
            raise SandboxFailure(f"{len(results)} replies for {n_ops} operations")
        return results

    def _read_message(self, deadline: float) -> Any:
        """The next line of the server, parsed."""
        return _parse(self._read_line(deadline))

    def _read_line(self, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        cap = self.settings.output_bytes + (64 << 10)
        while b"\n" not in self._buffer:
            if len(self._buffer) > cap:
                raise SandboxFailure(f"reply larger than {cap} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxFailure("no reply before the deadline")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise SandboxFailure(f"the fork server exited ({self._proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _frame(request: dict[str, Any]) -> bytes:
    """A request as the server reads it (`runner._requests`): its length, then marshal.

    The host is the one party the server trusts, and marshal writes and reads a request several
    times faster than JSON (a group of 512 answers: 6 us against 90 to write, 13 against 47 to
    read). Ops hold JSON values only (dicts with str keys, lists, str, int, float, bool, None),
    as the environment's routines are promised: marshal would also carry a tuple or an int key
    as it is, where JSON would have made a list or a str of it."""
    try:
        payload = marshal.dumps(request)
    except ValueError as exc:  # an object marshal cannot write, or nested too deep
        raise TypeError(f"sandbox ops must hold JSON values only: {exc}") from None
    return len(payload).to_bytes(REQUEST_HEADER_BYTES, "little") + payload


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise SandboxFailure("reply is not JSON") from exc


def _parse_result(line: bytes, index: int) -> dict[str, Any]:
    """The result of op `index` in `line`, or its failure when the line is not exactly that."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        message = None
    if (
        isinstance(message, dict)
        and message.get("i") == index
        and isinstance(message.get("ok"), bool)
    ):
        return message
    return {"ok": False, "kind": "output", "error": "the environment wrote a malformed result"}


def _to_result(message: dict[str, Any]) -> OpResult:
    seconds = message.get("seconds")
    if not isinstance(seconds, dict):
        seconds = {}
    if message["ok"]:
        return OpResult(True, value=message.get("value"), seconds=seconds)
    return OpResult(
        False,
        kind=str(message.get("kind", "crash")),
        routine=str(message.get("routine", "")),
        error=str(message.get("error", ""))[:2000],
        seconds=seconds,
    )
