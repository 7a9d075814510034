"""The host side of the sandbox: start the fork server, run requests in its children, read
their untrusted results (see `Sandbox`; docs/SANDBOX.md#how-a-request-runs).
"""

from __future__ import annotations

import json
import marshal
import os
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from evoenv_worker.sandbox.launch import server_command
from evoenv_worker.sandbox.results import op_label, read_result
from evoenv_worker.sandbox.runner import (
    CODE_CACHE_BYTES,
    CODE_CACHE_ENTRIES,
    MAX_FAILURES_PER_REQUEST,
    MESSAGE_BYTES,
    RESULT_PREFIX,
)
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
    """exception, type, value, timeout, memory, crash, output, load, dependency, skipped or
    tamper (see `results.KINDS`)."""
    routine: str = ""
    error: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return self.error or self.kind


class Sandbox:
    """A confined fork server for environment code. One request at a time (a lock guards it).

    One long-lived fork server (see `runner.py` for the protocol), started confined (see
    `launch.py`) and restarted when it dies. The server only manages processes: it hands the
    host started children, each with its two pipes, and kills and reaps them when told. `run`
    writes a request's work straight to a child and reads its results straight from it, and
    returns one `OpResult` per operation. Every failure of environment code (a raise, a timeout,
    running out of memory, a crash, an oversized or malformed result) comes back as a failed
    `OpResult`, never as an exception; exceptions (`SandboxUnavailable`, `SandboxFailure`) mean
    the sandbox itself could not do its job.

    Nothing a child or the server writes is trusted. A child's result lines are size-capped,
    must begin as the expected op's result does (`{"i":N,"ok":`), and are parsed with bounds and
    checked against the shape of that op's result (`results.read_result`): a line that begins
    so but is not exactly that fails that op ("output", or "value" for a score that is not a
    number in [0, 1]) with a reason naming the op, its seed and difficulty; anything else fails
    the op and ends that child, and the rest of the request runs in a fresh one. A message from
    the server that is not what the protocol says ends the server.
    """

    def __init__(self, settings: SandboxSettings, *, hash_seed: int = 0) -> None:
        self.settings = settings
        self.hash_seed = hash_seed
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._offered: list[_Child] = []
        self._code: dict[tuple[str, str], bytes] = {}
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
        self._kill()  # a server that died between calls: reap it and close what it gave us
        argv, env, self.isolated = server_command(self.settings, hash_seed=self.hash_seed)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            raise SandboxUnavailable(f"cannot start the sandbox ({argv[0]}): {exc}") from exc
        finally:
            theirs.close()
        self._control = ours
        deadline = time.monotonic() + self.settings.start_seconds
        try:
            hello = self._receive(deadline)
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

        Ops hold JSON values only (see `_work`); anything marshal cannot write is a TypeError
        before anything is sent.

        `op_seconds` (default: the settings' `op_seconds`) is the wall-clock limit of each op of
        this request, and the CPU limit is that times the number of ops. Pass a longer one for
        ops that do the work of many, such as a `grade` op scoring a group of answers
        (`grade.grade_op_seconds`): the limit applies to the whole op, and an op that overruns
        it fails as a whole.
        """
        if not ops:
            return []
        limits = {
            "op_seconds": op_seconds or self.settings.op_seconds,
            "memory_mb": self.settings.memory_mb,
            "output_bytes": self.settings.output_bytes,
        }
        with self._lock:
            for attempt in (1, 2):
                self.start()
                try:
                    return self._serve(source, filename, ops, limits)
                except SandboxFailure as exc:
                    self._kill()
                    self.restarts += 1
                    log.warning("sandbox_restarted", reason=str(exc), attempt=attempt)
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------------------- internals

    def _serve(
        self, source: str, filename: str, ops: list[dict[str, Any]], limits: dict[str, Any]
    ) -> list[OpResult]:
        """Run the ops in children: all in one, unless one fails by dying, overrunning or
        writing what it should not; then the rest in a fresh one, up to
        `MAX_FAILURES_PER_REQUEST` children."""
        results: list[dict[str, Any] | None] = [None] * len(ops)
        pending = list(range(len(ops)))
        failures = 0
        key = (filename, source)
        while pending:
            if failures >= MAX_FAILURES_PER_REQUEST:
                error = f"skipped after {failures} failed calls in this request"
                for index in pending:
                    results[index] = _fail("skipped", error)
                break
            batch = [(index, _resolve(ops[index], results)) for index in pending]
            code = self._code.pop(key, None)
            if code is not None:
                self._code[key] = code  # now the most recently used
            work = _work(source, filename, batch, limits, code)
            started = time.monotonic()
            child = self._hand_over(work)
            finished, failure = self._collect(
                child, ops, pending, results, limits, key if code is None else None, started
            )
            pending = pending[finished:]
            if failure is not None:
                failures += 1
                failure["error"] = f"{op_label(ops, pending[0])}: {failure['error']}"
                results[pending[0]] = failure
                pending = pending[1:]
        done = [_to_result(result) for result in results if result is not None]
        if len(done) != len(ops):
            raise SandboxFailure(f"{len(done)} results for {len(ops)} operations")
        return done

    def _hand_over(self, work: bytes) -> _Child:
        """Write `work` to the started child the server gave us; a fresh one if it is gone."""
        for attempt in (1, 2):
            child = self._take()
            try:
                # If the second is gone too, `_collect` sees it die.
                if self._write_work(child, work) or attempt == 2:
                    return child
                self._tell("stop", child.pid)
            except BaseException:
                os.close(child.results)
                raise
            os.close(child.results)
        raise AssertionError("unreachable")

    def _take(self) -> _Child:
        deadline = time.monotonic() + _SLACK_SECONDS
        while not self._offered:
            message = self._receive(deadline)
            if message is not None:
                raise SandboxFailure(f"unexpected message from the fork server: {message!r:.200}")
        return self._offered.pop(0)

    def _write_work(self, child: _Child, work: bytes) -> bool:
        """Write the work and close the pipe (the child reads to its end); then tell the server,
        which starts the next child while this one works. False if the child is gone."""
        try:
            view = memoryview(work)
            while view:
                view = view[os.write(child.work, view) :]
        except BrokenPipeError:
            return False
        finally:
            os.close(child.work)
            self._tell("took", child.pid)
        return True

    def _collect(
        self,
        child: _Child,
        ops: list[dict[str, Any]],
        pending: list[int],
        results: list[dict[str, Any] | None],
        limits: dict[str, Any],
        cache_key: tuple[str, str] | None,
        started: float,
    ) -> tuple[int, dict[str, Any] | None]:
        """Read the child's result lines into `results`; return how many of `pending` finished
        and the failure of the next, if any. The first op's time counts from `started`.

        With `cache_key`, the child's first line is its compiled module (`runner._send_code`).
        A result line must begin as the expected op's does (`RESULT_PREFIX`); one that does but
        is not that op's result, of the shape the op promises, fails that op alone
        (`results.read_result`)."""
        op_seconds, cap = limits["op_seconds"], limits["output_bytes"]
        fd = child.results
        buffer = b""
        finished = 0
        deadline = started + op_seconds
        reaped = False
        try:
            while finished < len(pending):
                ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
                if not ready:
                    return finished, _fail("timeout", f"no result within {op_seconds:g} s")
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # dead, or it closed its pipe and lives on
                    reaped = True
                    return finished, self._reap(child.pid)
                buffer += chunk
                while b"\n" in buffer and finished < len(pending):
                    line, buffer = buffer.split(b"\n", 1)
                    if cache_key is not None:
                        self._store_code(cache_key, line)
                        cache_key = None
                        continue
                    index = pending[finished]
                    if not line.startswith(RESULT_PREFIX % index):
                        return finished, _fail("output", "the child wrote a malformed result")
                    results[index] = read_result(line, index, ops)
                    finished += 1
                    deadline = time.monotonic() + op_seconds
                if len(buffer) > cap:
                    return finished, _fail("output", f"result larger than {cap} bytes")
            return finished, None
        finally:
            os.close(fd)
            if not reaped:  # it overran, wrote what it should not, or is done: it must not
                self._tell("stop", child.pid, quiet=True)  # outlive the request

    def _store_code(self, key: tuple[str, str], line: bytes) -> None:
        """Keep the compiled module a child sent, as bytes: only children unmarshal it."""
        try:
            code = bytes.fromhex(json.loads(line)["code"])
        except (ValueError, KeyError, TypeError):
            return  # {"code": null}: nothing to keep
        if len(code) > CODE_CACHE_BYTES:
            return
        self._code.pop(key, None)
        self._code[key] = code
        while len(self._code) > CODE_CACHE_ENTRIES:
            del self._code[next(iter(self._code))]

    def _reap(self, pid: int) -> dict[str, Any]:
        """Have the server kill and reap a child whose pipe closed; its death as a failure."""
        self._tell("reap", pid)
        deadline = time.monotonic() + _SLACK_SECONDS
        message = None
        while message is None:
            message = self._receive(deadline)
        if (
            isinstance(message, list)
            and len(message) == 4
            and message[:2] == ["status", pid]
            and message[2] in ("crash", "timeout")
            and isinstance(message[3], str)
        ):
            return _fail(message[2], message[3][:2000])
        raise SandboxFailure(f"unexpected message from the fork server: {message!r:.200}")

    def _tell(self, what: str, pid: int, *, quiet: bool = False) -> None:
        """Send the server a message; `quiet`: if it is gone, the next message will say so."""
        assert self._control is not None
        try:
            self._control.send(marshal.dumps((what, pid)), socket.MSG_NOSIGNAL)
        except OSError as exc:
            if not quiet:
                raise SandboxFailure(f"the fork server is gone: {exc}") from exc

    def _receive(self, deadline: float) -> Any:
        """The server's next message; None when it was a child handed to us (kept in
        `_offered`)."""
        control = self._control
        assert control is not None
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([control], [], [], remaining)[0]:
            raise SandboxFailure("no message from the fork server before the deadline")
        try:
            data, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2 + 1)
        except OSError as exc:
            raise SandboxFailure(f"the fork server is gone: {exc}") from exc
        for fd in fds:
            os.set_inheritable(fd, False)
        try:
            if not data:
                raise SandboxFailure(f"the fork server exited ({self._proc_status()})")
            message = _parse(data)
        except SandboxFailure:
            for fd in fds:
                os.close(fd)
            raise
        if (
            isinstance(message, list)
            and len(message) == 2
            and message[0] == "child"
            and type(message[1]) is int
            and len(fds) == 2
        ):
            self._offered.append(_Child(message[1], fds[0], fds[1]))
            return None
        for fd in fds:
            os.close(fd)
        if fds or message is None:
            raise SandboxFailure(f"unexpected message from the fork server: {message!r:.200}")
        return message

    def _proc_status(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        control, self._control = self._control, None
        offered, self._offered = self._offered, []
        for child in offered:
            os.close(child.work)
            os.close(child.results)
        if control is not None:
            control.close()
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


class _Child(NamedTuple):
    """A started child the server handed us: its pid there and our ends of its pipes."""

    pid: int
    work: int
    results: int


def _work(
    source: str,
    filename: str,
    batch: list[tuple[int, Any]],
    limits: dict[str, Any],
    code: bytes | None,
) -> bytes:
    """A child's work as it reads it (`runner._child`): marshal, read to the end of the pipe.

    The host is the one party a child trusts before environment code runs in it, and marshal
    writes and reads a request several times faster than JSON (a group of 512 answers: 6 us
    against 90 to write, 13 against 47 to read). Ops hold JSON values only (dicts with str keys,
    lists, str, int, float, bool, None), as the environment's routines are promised: marshal
    would also carry a tuple or an int key as it is, where JSON would have made a list or a str
    of it."""
    try:
        return marshal.dumps((source, filename, batch, limits, code, True))
    except ValueError as exc:  # an object marshal cannot write, or nested too deep
        raise TypeError(f"sandbox ops must hold JSON values only: {exc}") from None


def _resolve(op: Any, results: list[dict[str, Any] | None]) -> Any:
    """Give a score op the instance of its source op when that ran in an earlier child."""
    source = op.get("from") if isinstance(op, dict) and op.get("op") == "score" else None
    if not isinstance(source, int) or not 0 <= source < len(results):
        return op
    done = results[source]
    if done is None or done.get("ok") is not True:
        return op  # not run yet, or failed: the child says so ("dependency")
    value = done.get("value")
    if not isinstance(value, dict):
        value = {}
    answer = op.get("answer")
    if answer is None and isinstance(value.get("answer_text"), str):
        answer = value["answer_text"].strip()
    return {
        "op": "score",
        "answer": answer,
        "from": None,
        "instance": value.get("instance"),
        "reference": value.get("reference"),
    }


def _fail(kind: str, error: str) -> dict[str, Any]:
    return {"ok": False, "kind": kind, "routine": "", "error": error}


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise SandboxFailure("a message from the fork server is not JSON") from exc


def _to_result(message: dict[str, Any]) -> OpResult:
    """An op's result as `results.read_result` checked it (or as the host made it)."""
    seconds = message.get("seconds") or {}
    if message["ok"]:
        return OpResult(True, value=message["value"], seconds=seconds)
    return OpResult(
        False,
        kind=message["kind"],
        routine=message.get("routine", ""),
        error=message["error"],
        seconds=seconds,
    )
