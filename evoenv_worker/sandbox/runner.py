"""The fork server that runs inside the sandbox. Standard library only.

Started by `host.Sandbox` as `python -I -S -B runner.py ROOT [--confine]`, where ROOT holds the
`shared` package. It reads requests on stdin (marshal, from the host, the one party it trusts:
`_requests`) and hands each to a child forked and started before the request came (`Spares`:
forked a few at a time; when its turn comes, a child confines itself, `confine.confine_child`,
sets rlimits and rehearses with an environment of ours, `_rehearse`), which takes its work over
a pipe, sets the request's own limits, loads the environment source and runs the request's
operations in order, writing one JSON line per operation to a private pipe. While it works
the server starts the next child (forking more when none is left). The server checks that each
line begins as the child writes it, `{"i":N,"ok":` with the expected N, and relays it to stdout
as it is, without parsing it (the host parses every line and takes one that is not such a JSON
object as that operation's failure); it enforces the per-operation time limit and the output
cap, and takes a fresh child for the remaining operations when one dies, overruns or writes
anything else. It ends every request with a `{"done": true}` line once every child of the
request is dead or SIGKILLed (it can run nothing more), and reaps the killed ones as they
finish dying, while it waits for the next request or serves it: tearing down a child takes
about a millisecond.

The server itself never runs environment code. A child can only forge the results of its own
request (it is the code being judged, so that gives it nothing its routines could not do);
it cannot touch the server, later requests or the host. The one thing a child hands the server
beyond its results, its compiled module for `_code_cache`, is written before any environment
code runs in it and is never unmarshalled by the server.

Operations (each a dict with "op"):
- describe: the class attributes of the environment.
- instance {seed, difficulty}: sample, solve, render, answer_text for one instance.
- score {answer, from: k} or {answer, instance, reference}: score one extracted answer against
  the instance of operation k of the same request, or against the given instance. With
  "from" and a null answer, the answer is that instance's own answer_text, stripped.
- answer_text {reference}: how the environment writes a given reference.
- solve {instance}: solve and answer_text for a given instance (the reference this environment
  gives another environment's instance: admission's same-oracle check). Its value is
  {"reference", "answer_text"}.
- grade {seed, difficulty, answers: [str | null, ...]}: the batched grading path. Sample and
  solve the instance once (as `instance` does: sample, solve, render, answer_text), then score
  every non-null answer against it. Its value is {"scores": [float], "outcomes": [int | null],
  "errors": {position: str}, "prompt", "answer_text"}: "scores" holds each distinct reward
  once, and "outcomes" has one entry per answer, the index in "scores" of its reward (JSON
  reads an int several times faster than a float, and a group has few distinct rewards). A
  null answer has a null outcome; an answer whose scorer raised, ran out of memory or returned
  something that is not a number in [0, 1] has a null outcome and its error in words in
  "errors" under its position (a string: JSON keys are strings). Those are per-answer
  failures: the op still succeeds.
  The op fails (like `instance`) only when sampling, solving, rendering or answer_text fails,
  or when `answers` is not a list; and, like any op, when the whole op overruns the time limit,
  runs the child out of memory or kills it: then no answer of it has a reward.
  Each score call gets its own copy of the instance and the reference, as the `score` op does.
  Its "seconds" has sample, solve, render, answer_text, and score for all the answers together.
Every result is {"i", "ok", ...}: ok results carry "value" (and "seconds"); failed ones carry
"kind" (exception, type, value, timeout, memory, crash, output, load, dependency, skipped),
"routine" and "error".

Limits. "op_seconds" bounds each op of a request (the wall-clock time from the previous result
line to this op's line) and, times the number of ops, the child's CPU time; "memory_mb" is the
child's address-space limit; "output_bytes" caps each result line. A caller sending a `grade`
op with many answers passes a longer "op_seconds" for that request (`Sandbox.run`'s
`op_seconds`), since the limit applies to the whole op.
"""

from __future__ import annotations

import json
import marshal
import os
import resource
import select
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

RESULT_PREFIX = b'{"i":%d,"ok":'
"""How a child's result line for op N begins: all the server checks of it (`_relay`)."""
REQUEST_HEADER_BYTES = 4
"""The length that comes before each request (`_requests`)."""
SPARES = 4
"""Children forked in a row (see `Spares`)."""
MAX_FAILURES_PER_REQUEST = 3
"""After this many dead or overrunning children, the rest of a request is skipped."""
CHILD_OPEN_FILES = 256
"""RLIMIT_NOFILE of a child: bounds the kernel memory its descriptors can hold."""
CODE_CACHE_ENTRIES = 16
"""Compiled environment modules the server keeps (see `_code_cache`)."""
CODE_CACHE_BYTES = 256 << 10
"""Largest compiled module (marshal bytes) the server keeps."""

_code_cache: dict[tuple[str, str], bytes] = {}
"""(filename, source) -> marshal bytes of `compile(source, filename, "exec")`, oldest first.

Compiling is most of what loading an environment costs, so the first child of a request whose
source is not here compiles it and sends the marshalled code object as its first line, before
any environment code has run in it (so the bytes are a pure function of the source), and later
children unmarshal it instead of compiling. The server only stores the bytes; it never
unmarshals or runs them."""
_rehearsal: list[bytes] = []
"""The compiled `REHEARSAL` module as marshal bytes, made once by the server (`_rehearse`)."""
_quiet: list[Any] = []
"""The text stream a child's `sys.stdout` and `sys.stderr` become (writes to its fd 1, which is
/dev/null), made once by the server: opening one in every child costs a quarter millisecond."""


def main() -> None:
    root = sys.argv[1]
    confined = "--confine" in sys.argv[2:]
    sys.path.insert(0, root)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shared.environment  # noqa: F401 - imported once here; every child inherits it

    if confined:
        import confine  # beside this file, also standard library only

        confine.confine_server()
        status = confine.status()
    else:
        status = {"isolated": False}
    # A request's lines go out together, with its done line (`_done`): the host reads none of
    # them before that one, and one write wakes it once.
    out = os.fdopen(os.dup(1), "wb", buffering=1 << 20)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    _quiet.append(open(1, "w", closefd=False))  # noqa: SIM115 - lives as long as the server
    _rehearsal.append(marshal.dumps(compile(REHEARSAL, "rehearsal.py", "exec")))
    spares = Spares(confined)
    spares.start_next()
    _done(out, {"ready": True, "python": sys.version.split()[0], "confinement": status})
    for frame in _requests(sys.stdin.fileno()):
        try:
            request = marshal.loads(frame)
            ops = request["ops"]
            source = request["source"]
            if not isinstance(ops, list):
                raise TypeError("ops is not a list")
        except (ValueError, EOFError, KeyError, TypeError) as exc:
            _done(out, {"done": True, "error": f"malformed request: {exc}"})
            continue
        serve_request(out, request, source, ops, spares)
        _done(out, {"done": True})


def _requests(fd: int) -> Iterator[bytes]:
    """The host's requests: each a little-endian length of `REQUEST_HEADER_BYTES` bytes, then
    that many bytes of marshal (`host._frame`). While it waits for the next, the server reaps
    the children it stopped (`_stop`) as each finishes dying."""
    buffer = bytearray()
    while True:
        while True:
            if len(buffer) >= REQUEST_HEADER_BYTES:
                end = REQUEST_HEADER_BYTES + int.from_bytes(buffer[:REQUEST_HEADER_BYTES], "little")
                if len(buffer) >= end:
                    break
            ready, _, _ = select.select([fd, *_stopped.values()], [], [])
            _reap_dead(ready)
            if fd in ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return
                buffer += chunk
        yield bytes(buffer[REQUEST_HEADER_BYTES:end])
        del buffer[:end]


def _emit(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def _done(out: Any, message: dict[str, Any]) -> None:
    """Write the last line of a reply and send the whole reply."""
    _emit(out, message)
    out.flush()


# --------------------------------------------------------------------------- the server side


class Spares:
    """Children forked ahead of their requests; the next one confined and ready.

    Forking a child and confining it (rlimits, Landlock, seccomp) is most of a request's fixed
    cost, and none of it depends on the request. So the server keeps the next child started
    before its request comes: forked, confined and waiting for its work on a pipe, with no
    environment code run in it. A request takes it, hands it the work, and starts the next one
    while this one runs (on another core, or while the host waits anyway). A child serves one
    request.

    Children are forked `SPARES` at a time, each then waiting for its turn before it does
    anything: a fork write-protects every page of the server, so each page the server writes
    afterwards costs it a copy (some 260 pages a request here, most of a millisecond), once per
    fork; after forking several in a row it pays that once for all of them. They are started
    one at a time, so the work of getting ready never competes with more than one request.
    """

    def __init__(self, confined: bool) -> None:
        self.confined = confined
        self.forked: list[tuple[int, int, int]] = []
        """Children waiting for their turn: (pid, the write end of its work pipe, the read end
        of its result pipe)."""
        self.next: tuple[int, int, int] | None = None
        """The child started for the next request."""

    def start_next(self) -> None:
        """Start the child of the next request (fork more first, if none is left)."""
        if self.next is None:
            if not self.forked:
                self.forked = [_fork_child(self.confined) for _ in range(SPARES)]
            self.next = self.forked.pop()
            try:
                os.write(self.next[1], _START)
            except BrokenPipeError:
                pass  # it died waiting: handing it its work fails, and another is taken

    def take(self) -> tuple[int, int, int]:
        """The started child (one started now when there is none), now the caller's."""
        self.start_next()
        assert self.next is not None
        taken, self.next = self.next, None
        return taken


_START = b"\x01"
"""What the server writes to a forked child's work pipe when its turn comes."""


def _fork_child(confined: bool) -> tuple[int, int, int]:
    work_read, work_write = os.pipe()
    result_read, result_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(work_read, result_write, confined)
    os.close(work_read)
    os.close(result_write)
    return pid, work_write, result_read


def serve_request(
    out: Any, request: dict[str, Any], source: str, ops: list[Any], spares: Spares
) -> None:
    limits = request.get("limits", {})
    filename = request.get("filename", "environment.py")
    op_seconds = float(limits.get("op_seconds", 10.0))
    output_bytes = int(limits.get("output_bytes", 1 << 20))
    done: dict[int, bytes] = {}
    pending = list(range(len(ops)))
    failures = 0
    while pending:
        if failures >= MAX_FAILURES_PER_REQUEST:
            for i in pending:
                _emit(
                    out,
                    _fail(
                        i, "skipped", "", f"skipped after {failures} failed calls in this request"
                    ),
                )
            return
        batch = [(i, _resolve(ops[i], done)) for i in pending]
        key = (filename, source) if isinstance(filename, str) and isinstance(source, str) else None
        code = _cached_code(key)
        # All of it came from marshal (the request) or JSON (results the server parsed),
        # within marshal's depth.
        work = marshal.dumps((source, filename, batch, limits, code, key is not None))
        started = time.monotonic()
        pid, work_fd, read_fd = spares.take()
        if not _hand_over(work_fd, work):  # it died waiting: a fresh one
            _kill(pid)
            os.close(read_fd)
            pid, work_fd, read_fd = spares.take()
            _hand_over(work_fd, work)  # if this one is gone too, _relay reports the crash
        spares.start_next()  # while this child works
        cache_key = key if code is None else None
        finished, failure = _relay(
            out, read_fd, pid, pending, op_seconds, output_bytes, done, cache_key, started
        )
        os.close(read_fd)
        pending = pending[finished:]
        if failure is not None:
            failures += 1
            _emit(out, failure)
            pending = pending[1:]


def _hand_over(fd: int, work: bytes) -> bool:
    """Write `work` to a spare's work pipe and close it; False if the spare is gone."""
    try:
        view = memoryview(work)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        return False
    finally:
        os.close(fd)
    return True


def _resolve(op: Any, done: dict[int, bytes]) -> Any:
    """Give a score op the instance of its source op when that ran in an earlier child."""
    if isinstance(op, dict) and op.get("op") == "score" and op.get("from") in done:
        try:
            value = json.loads(done[op["from"]]).get("value")
        except (ValueError, RecursionError, AttributeError):
            value = None
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
    return op


def _relay(
    out: Any,
    fd: int,
    pid: int,
    pending: list[int],
    op_seconds: float,
    cap: int,
    done: dict[int, bytes],
    cache_key: tuple[str, str] | None,
    started: float,
) -> tuple[int, dict[str, Any] | None]:
    """Copy the child's result lines to `out`; return how many finished and the failure, if any.

    With `cache_key`, the child's first line is its code line (`_send_code`), kept, not relayed.
    The first op's time counts from `started`, when the child was handed its work.
    """
    buffer = b""
    finished = 0
    deadline = started + op_seconds
    while finished < len(pending):
        index = pending[finished]
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0))
        if not ready:
            _stop(pid)
            return finished, _fail(index, "timeout", "", f"no result within {op_seconds:g} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # dead, or it closed its pipe and lives on: kill before waiting
            status = _kill(pid)
            return finished, _fail(index, *status)
        buffer += chunk
        while b"\n" in buffer and finished < len(pending):
            line, buffer = buffer.split(b"\n", 1)
            index = pending[finished]
            if cache_key is not None:  # the first line is the code line (`_send_code`)
                _store_code(cache_key, line)
                cache_key = None
                continue
            prefix = RESULT_PREFIX % index
            if not line.startswith(prefix):
                _stop(pid)
                return finished, _fail(index, "output", "", "the child wrote a malformed result")
            if line.startswith(b"true", len(prefix)):
                done[index] = line  # parsed only if a later child needs it (`_resolve`)
            # It holds no newline and begins as only a result of this op does; the host parses
            # it, and takes it as this op's failure when it is not one whole JSON object.
            out.write(line + b"\n")
            finished += 1
            deadline = time.monotonic() + op_seconds
        if len(buffer) > cap:
            _stop(pid)
            return finished, _fail(
                pending[finished], "output", "", f"result larger than {cap} bytes"
            )
    _stop(pid)  # it has answered everything; it must not outlive the request (os._exit patched)
    return finished, None


def _cached_code(key: tuple[str, str] | None) -> bytes | None:
    """The kept code of `key`, now the most recently used (the oldest goes out first)."""
    code = _code_cache.pop(key, None) if key is not None else None
    if key is not None and code is not None:
        _code_cache[key] = code
    return code


def _store_code(key: tuple[str, str], line: bytes) -> None:
    """Keep the code a child sent (`_send_code`); the server never unmarshals it."""
    try:
        code = bytes.fromhex(json.loads(line)["code"])
    except (ValueError, KeyError, TypeError):
        return  # {"code": null}: nothing to keep
    _code_cache.pop(key, None)
    _code_cache[key] = code
    while len(_code_cache) > CODE_CACHE_ENTRIES:
        del _code_cache[next(iter(_code_cache))]


_stopped: dict[int, int] = {}
"""Children `_stop` killed and not reaped yet: pid -> a pidfd, readable once it is dead."""
MAX_DYING = 8
"""Killed children the server lets die in the background; one more, and it waits for them."""


def _stop(pid: int) -> None:
    """SIGKILL a child that needs no post-mortem: it can run nothing more, so the request
    goes on while the kernel tears it down (a millisecond for a process this size), and the
    server reaps it later (`_requests`, `_reap_dead`)."""
    _sigkill(pid)
    if len(_stopped) >= MAX_DYING:
        _reap_dead(list(_stopped.values()))
    try:
        _stopped[pid] = os.pidfd_open(pid)
    except OSError:  # out of descriptors: wait for it now
        os.waitpid(pid, 0)


def _reap_dead(ready: list[int]) -> None:
    """Reap the stopped children whose pidfd is in `ready`: at once if dead, as `select` says
    they are in `_requests`; after the end of their teardown if not."""
    for pid, pidfd in list(_stopped.items()):
        if pidfd in ready:
            os.waitpid(pid, 0)
            os.close(pidfd)
            del _stopped[pid]


def _kill(pid: int) -> tuple[str, str, str]:
    """SIGKILL the child and reap it. A child that already exited keeps its own status."""
    _sigkill(pid)
    return _reap(pid)


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> tuple[str, str, str]:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return "timeout", "", "CPU time limit exceeded"
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return "crash", "", f"the process died with {name}"
    code = os.WEXITSTATUS(status)
    return "crash", "", f"the process exited with status {code} before finishing"


def _fail(index: int, kind: str, routine: str, error: str) -> dict[str, Any]:
    return {"i": index, "ok": False, "kind": kind, "routine": routine, "error": error}


# --------------------------------------------------------------------------- the child side


def _child(work_fd: int, write_fd: int, confined: bool) -> None:
    """A forked child: close what is not its own, wait for its turn, confine itself, rehearse,
    wait for its work, run it, write the results, exit."""
    try:
        keep = (work_fd, write_fd)
        if confined:
            import confine

            keep += confine.child_fds()
        _close_others(keep)
        if os.read(work_fd, len(_START)) != _START:  # the server went away
            return
        _isolate_child(confined)
        _rehearse()
        work = _read_all(work_fd)
        if not work:  # the server went away, or never had work for it
            return
        source, filename, batch, limits, code, cacheable = marshal.loads(work)
        del work
        _limit_child(limits, len(batch))
        results = os.fdopen(write_fd, "wb", buffering=0)
        dumps = json.dumps
        compiled = _compile(source, filename, code)
        _code_cache.clear()  # other environments' code is none of this one's business
        if code is None and cacheable:
            _send_code(write_fd, compiled, int(limits.get("output_bytes", 1 << 20)))
        env_or_error = compiled if isinstance(compiled, str) else _load(compiled, filename)
        kept: dict[int, dict[str, Any]] = {}
        for index, op in batch:
            if isinstance(env_or_error, str):
                result = _fail(index, "load", "load", env_or_error)
            else:
                result = run_op(env_or_error, op, kept, index)
                result.pop("i", None)
                result = {"i": index, **result}  # the line begins {"i":N,"ok": (`_relay`)
            try:
                line = dumps(result, separators=(",", ":"), default=_unencodable)
            except (ValueError, RecursionError):
                line = dumps(
                    _fail(
                        index, "type", result.get("routine", ""), "result cannot be encoded as JSON"
                    )
                )
            results.write(line.encode("utf-8", "replace") + b"\n")
    finally:
        os._exit(0)


def _close_others(keep: tuple[int, ...]) -> None:
    """Just after the fork: fds 0-2 on /dev/null, and every other descriptor closed but
    `keep` (its pipes; the other children's are none of its business)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _isolate_child(confined: bool) -> None:
    """What every child gets before it takes its work: confined, the nested Landlock domain
    and the seccomp filter, and the limits that do not depend on the request."""
    if confined:
        import confine

        confine.confine_child()
    # fds 1 and 2 are /dev/null; so is the stream the server made for this (`_quiet`).
    sys.stdout = sys.stderr = _quiet[0] if _quiet else open(os.devnull, "w")  # noqa: SIM115
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Descriptors hold kernel memory RLIMIT_AS does not count (pipe buffers, epoll, ...).
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHILD_OPEN_FILES, CHILD_OPEN_FILES))


REHEARSAL = """
import random

from shared.environment import Environment


class Rehearsal(Environment):
    name = "rehearsal"
    description = "Sort some words."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"words": [str(rng.random()) for _ in range(4 * difficulty)]}

    def solve(self, instance: dict) -> list:
        return sorted(instance["words"])

    def render(self, instance: dict) -> str:
        return "Sort these words: " + ", ".join(instance["words"]) + "."

    def score(self, instance: dict, reference: list, answer: str) -> float:
        return 1.0 if [item.strip() for item in answer.split(",")] == reference else 0.0
"""
"""Our own environment, run by every spare before its work comes (`_rehearse`)."""
REHEARSAL_ANSWERS = 64


def _rehearse() -> None:
    """Go through the motions of a request with `REHEARSAL`, while the spare waits anyway.

    A forked child shares the server's memory copy-on-write, and on this kind of machine (a
    VM) each page a process first writes after a fork costs 2.3-4.5 us to copy: loading and
    grading took some 500 such faults, over a millisecond of a request. Most are the same pages
    for any environment (the allocator's free memory, the objects every load and grade uses);
    rehearsing with a small environment of ours writes them before the request comes, so its
    own work finds them private already (about 20 faults). The faults move, they are not added.
    No environment code has run in the spare when it takes its work: this one is ours.
    """
    env = _load(marshal.loads(_rehearsal[0]), "rehearsal.py")  # as a request's cached code
    op = {"op": "grade", "seed": 0, "difficulty": 3, "answers": ["a, b"] * REHEARSAL_ANSWERS}
    json.loads(json.dumps(run_op(env, op, {}, 0)))
    del env
    sys.modules.pop("candidate", None)


def _limit_child(limits: dict[str, Any], n_ops: int) -> None:
    """The request's limits: address space, and CPU time for all of its ops. The filter lets
    a child set its own limits (never another process's), so this comes after it."""
    memory = int(limits.get("memory_mb", 1024)) << 20
    cpu = int(float(limits.get("op_seconds", 10.0)) * n_ops) + 2
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _unencodable(value: object) -> str:
    return f"<{type(value).__name__}>"


def _compile(source: str, filename: str, cached: bytes | None) -> Any:
    """The module's code object (from the server's cache when it has it), or an error."""
    if cached is not None:
        try:
            return marshal.loads(cached)
        except (ValueError, EOFError, TypeError, MemoryError):
            pass
    try:
        return compile(source, filename, "exec")
    except MemoryError:
        return "ran out of memory while loading the module"
    except BaseException as exc:  # noqa: BLE001 - a source that does not compile is its failure
        return f"loading the module raised {_describe(exc)}"


def _send_code(fd: int, code: Any, output_bytes: int) -> None:
    """Write the code line: the compiled module, or null when there is none to keep.

    It is the child's first line and is written whole before any environment code runs in
    this process, so what the server keeps depends on the source alone; the server takes the
    first line of such a child as this line, whatever it holds."""
    line = b'{"code":null}\n'
    if not isinstance(code, str):
        try:
            data = marshal.dumps(code)
            if len(data) <= min(CODE_CACHE_BYTES, output_bytes // 4):
                line = b'{"code":"' + data.hex().encode() + b'"}\n'
        except (ValueError, MemoryError):
            pass
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]


def _load(code: Any, filename: str) -> Any:
    """Execute the compiled module; return an instance of its Environment class or an error."""
    from shared.environment import Environment

    module = types.ModuleType("candidate")
    module.__file__ = filename
    sys.modules["candidate"] = module
    try:
        exec(code, module.__dict__)
    except MemoryError:
        return "ran out of memory while loading the module"
    except BaseException as exc:  # noqa: BLE001 - anything the module does at import is its failure
        return f"loading the module raised {_describe(exc)}"
    classes = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Environment)
        and value is not Environment
        and value.__module__ == "candidate"
    ]
    if len(classes) != 1:
        return f"expected exactly one Environment subclass, found {len(classes)}"
    try:
        return classes[0]()
    except BaseException as exc:  # noqa: BLE001
        return f"constructing the environment raised {_describe(exc)}"


def run_op(env: Any, op: Any, kept: dict[int, dict[str, Any]], index: int) -> dict[str, Any]:
    """Run one operation on a loaded environment; never raises. `kept` holds instance results."""
    kind = op.get("op") if isinstance(op, dict) else None
    if kind == "describe":
        return _describe_env(env)
    if kind == "instance":
        result = _instance(env, op)
        if result["ok"]:
            kept[index] = result["value"]
        return result
    if kind == "score":
        return _score(env, op, kept)
    if kind == "answer_text":
        return _answer_text(env, op)
    if kind == "solve":
        return _solve(env, op)
    if kind == "grade":
        return _grade(env, op)
    return _fail(-1, "type", "", f"unknown operation {kind!r}")


def _describe_env(env: Any) -> dict[str, Any]:
    cls = type(env)
    value = {}
    for attr in ("name", "description", "oracle", "min_difficulty", "max_difficulty"):
        item = cls.__dict__.get(attr, None) if attr in cls.__dict__ else _class_attr(cls, attr)
        value[attr] = item if isinstance(item, (str, int, float, bool, type(None))) else repr(item)
    return {"ok": True, "value": value}


def _class_attr(cls: type, attr: str) -> Any:
    for klass in cls.__mro__:
        if attr in klass.__dict__:
            return klass.__dict__[attr]
    return None


def _instance(env: Any, op: dict[str, Any]) -> dict[str, Any]:
    from shared.environment import json_round_trips, make_rng, seed_global_random

    seed: Any = op.get("seed")
    difficulty: Any = op.get("difficulty")
    name = str(_class_attr(type(env), "name"))
    seconds: dict[str, float] = {}

    def call(routine: str, fn: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            seconds[routine] = round(time.perf_counter() - start, 6)

    routine = "sample"
    try:
        rng = make_rng(name, seed, difficulty)
        seed_global_random(name, seed, difficulty)
        instance = call("sample", env.sample, rng, difficulty)
        if not isinstance(instance, dict):
            return _fail(
                -1, "type", "sample", f"sample returned {type(instance).__name__}, expected dict"
            )
        instance_ok = json_round_trips(instance)
        routine = "solve"
        reference = call("solve", env.solve, _copy(instance, instance_ok))
        reference_ok = json_round_trips(reference)
        routine = "render"
        prompt = call("render", env.render, _copy(instance, instance_ok))
        if not isinstance(prompt, str):
            return _fail(
                -1, "type", "render", f"render returned {type(prompt).__name__}, expected str"
            )
        routine = "answer_text"
        text = call("answer_text", env.answer_text, _copy(reference, reference_ok))
        if not isinstance(text, str):
            return _fail(
                -1,
                "type",
                "answer_text",
                f"answer_text returned {type(text).__name__}, expected str",
            )
    except MemoryError:
        return _fail(-1, "memory", routine, f"{routine} ran out of memory")
    except BaseException as exc:  # noqa: BLE001 - the environment's failure, reported as a result
        return _fail(-1, "exception", routine, f"{routine} raised {_describe(exc)}")
    value = {
        "instance": instance,
        "reference": reference,
        "prompt": prompt,
        "answer_text": text,
        "round_trip": {"instance": instance_ok, "reference": reference_ok},
        "reference_type": type(reference).__name__,
    }
    return {"ok": True, "value": value, "seconds": seconds}


def _score(env: Any, op: dict[str, Any], kept: dict[int, dict[str, Any]]) -> dict[str, Any]:
    from shared.environment import grade_value

    source = op.get("from")
    if source is not None:
        if source not in kept:
            return _fail(-1, "dependency", "score", f"operation {source} produced no instance")
        instance, reference = kept[source]["instance"], kept[source]["reference"]
        answer = op.get("answer")
        if answer is None:  # the instance's own answer_text: the perfect answer
            answer = kept[source]["answer_text"].strip()
    else:
        instance, reference = op.get("instance"), op.get("reference")
        answer = op.get("answer")
    if not isinstance(answer, str):
        return _fail(-1, "type", "score", "answer must be a string")
    start = time.perf_counter()
    try:
        value = env.score(_copy(instance, True), _copy(reference, True), answer)
    except MemoryError:
        return _fail(-1, "memory", "score", "score ran out of memory")
    except BaseException as exc:  # noqa: BLE001
        return _fail(-1, "exception", "score", f"score raised {_describe(exc)}")
    seconds = {"score": round(time.perf_counter() - start, 6)}
    grade = grade_value(value)
    if grade.reward is None:
        return _fail(-1, "value", "score", grade.detail)
    return {"ok": True, "value": grade.reward, "seconds": seconds}


def _grade(env: Any, op: dict[str, Any]) -> dict[str, Any]:
    """Sample and solve one instance, then score every non-null answer of `op` against it."""
    from shared.environment import grade_value

    answers = op.get("answers")
    if not isinstance(answers, list):
        return _fail(-1, "type", "score", "answers must be a list of strings and nulls")
    made = _instance(env, op)
    if not made["ok"]:
        return made
    value = made["value"]
    instance_copy = _copier(value["instance"], value["round_trip"]["instance"])
    reference_copy = _copier(value["reference"], value["round_trip"]["reference"])
    score = env.score
    scores: dict[float, int] = {}  # reward -> its index in the value's "scores"
    outcomes: list[int | None] = []
    errors: dict[str, str] = {}
    start = time.perf_counter()
    for position, answer in enumerate(answers):
        reward = error = None
        if answer is None:
            pass
        elif not isinstance(answer, str):
            error = "answer must be a string"
        else:
            try:
                scored = score(instance_copy(), reference_copy(), answer)
            except MemoryError:
                error = "score ran out of memory"
            except BaseException as exc:  # noqa: BLE001 - this answer's failure, not the op's
                error = f"score raised {_describe(exc)}"
            else:
                if type(scored) is float and 0.0 <= scored <= 1.0:  # most scores: skip the rest
                    reward = scored
                else:
                    grade = grade_value(scored)
                    reward = grade.reward
                    if reward is None:
                        error = grade.detail
        if reward is None:
            outcomes.append(None)
            if error is not None:
                errors[str(position)] = error
        else:
            outcomes.append(scores.setdefault(reward, len(scores)))
    seconds = dict(made["seconds"])
    seconds["score"] = round(time.perf_counter() - start, 6)
    graded = {
        "scores": list(scores),
        "outcomes": outcomes,
        "errors": errors,
        "prompt": value["prompt"],
        "answer_text": value["answer_text"],
    }
    return {"ok": True, "value": graded, "seconds": seconds}


def _copier(value: Any, round_trips: bool) -> Callable[[], Any]:
    """A function giving a fresh copy of `value` at each call, as `_copy` would.

    A value that survives JSON unchanged holds only dicts, lists, str, int, float, bool and
    None. It is snapshotted once (marshal format 2, which shares no objects, as a JSON copy
    would not), so nothing the environment does to `value` later reaches the copies; then each
    copy is rebuilt from the snapshot by a tree of copy functions, one per dict or list (a
    `.copy()` where it holds only atoms, which are immutable), several times faster than
    unmarshalling on the small values most instances and references are. A snapshot with more
    than `COPY_TREE_CONTAINERS` dicts and lists is unmarshalled instead.
    """
    if round_trips:
        try:
            data = marshal.dumps(value, 2)
        except (ValueError, TypeError, RecursionError, MemoryError):
            pass
        else:
            tree = _tree_copier(marshal.loads(data), [COPY_TREE_CONTAINERS])
            if tree is not None:
                return tree
            loads = marshal.loads
            return lambda: loads(data)
    return lambda: _copy(value, True)


def _tree_copier(value: Any, budget: list[int]) -> Callable[[], Any] | None:
    """`_copier`'s tree for a snapshot; None once it would hold more than `budget` nodes."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return lambda: value
    budget[0] -= 1
    if budget[0] < 0:
        return None
    items = list(value.values() if kind is dict else value)
    if all(type(item) not in _CONTAINERS for item in items):
        return value.copy
    parts = [_tree_copier(item, budget) for item in items]
    if any(part is None for part in parts):
        return None
    if kind is list:
        return lambda: [part() for part in parts]  # type: ignore[misc]
    pairs = list(zip(value, parts, strict=True))
    return lambda: {key: part() for key, part in pairs}  # type: ignore[misc]


_CONTAINERS = (dict, list)
COPY_TREE_CONTAINERS = 64
"""Dicts and lists up to which `_copier` copies by a tree of functions, not by marshal."""


def _answer_text(env: Any, op: dict[str, Any]) -> dict[str, Any]:
    try:
        text = env.answer_text(_copy(op.get("reference"), True))
    except MemoryError:
        return _fail(-1, "memory", "answer_text", "answer_text ran out of memory")
    except BaseException as exc:  # noqa: BLE001
        return _fail(-1, "exception", "answer_text", f"answer_text raised {_describe(exc)}")
    if not isinstance(text, str):
        return _fail(
            -1, "type", "answer_text", f"answer_text returned {type(text).__name__}, expected str"
        )
    return {"ok": True, "value": text}


def _solve(env: Any, op: dict[str, Any]) -> dict[str, Any]:
    instance = op.get("instance")
    if not isinstance(instance, dict):
        return _fail(-1, "type", "solve", "instance must be a JSON object")
    try:
        reference = env.solve(_copy(instance, True))
    except MemoryError:
        return _fail(-1, "memory", "solve", "solve ran out of memory")
    except BaseException as exc:  # noqa: BLE001
        return _fail(-1, "exception", "solve", f"solve raised {_describe(exc)}")
    text = _answer_text(env, {"reference": reference})
    if not text["ok"]:
        return text
    return {"ok": True, "value": {"reference": reference, "answer_text": text["value"]}}


def _copy(value: Any, round_trips: bool) -> Any:
    """Each routine gets its own copy, so a routine that mutates its input changes nothing."""
    if not round_trips:
        return value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return value


def _describe(exc: BaseException) -> str:
    """The exception in words; never raises (its `__str__` and even its class name are the
    environment's code)."""
    try:
        text = str(exc)
        if len(text) > 300:
            text = text[:300] + "..."
        name = str(type(exc).__name__)
        return f"{name}: {text}" if text else name
    except BaseException:  # noqa: BLE001
        return "an exception that cannot be described"


if __name__ == "__main__":
    main()
