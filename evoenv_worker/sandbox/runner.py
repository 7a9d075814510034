"""The fork server that runs inside the sandbox, and its children. Standard library only.

The server manages processes and nothing else (`serve`); the host talks to the children
itself, and each child runs one request's operations (`_child`, `run_op`).
"""

from __future__ import annotations

import json
import marshal
import operator
import os
import resource
import select
import signal
import socket
import sys
import time
import types
from collections.abc import Callable
from typing import Any

RESULT_PREFIX = b'{"i":%d,"ok":'
"""How a child's result line for op N begins (`host.Sandbox._collect` checks it)."""
MESSAGE_BYTES = 1 << 16
"""The largest control message either side reads (each is a few dozen bytes)."""
SPARES = 4
"""Children forked in a row (see `Spares`)."""
STARTED = 1
"""Children started ahead besides the one the host holds (see `Spares`)."""
MAX_FAILURES_PER_REQUEST = 3
"""After this many dead or overrunning children, the rest of a request is skipped."""
CHILD_OPEN_FILES = 256
"""RLIMIT_NOFILE of a child: bounds the kernel memory its descriptors can hold."""
CODE_CACHE_ENTRIES = 16
"""Compiled environment modules the host keeps (see `_send_code`)."""
CODE_CACHE_BYTES = 256 << 10
"""Largest compiled module (marshal bytes) the host keeps."""

_rehearsal: list[bytes] = []
"""The compiled `REHEARSAL` module as marshal bytes, made once by the server (`_rehearse`)."""
_quiet: list[Any] = []
"""The text stream a child's `sys.stdout` and `sys.stderr` become (writes to its fd 1, which is
/dev/null), made once by the server: opening one in every child costs a quarter millisecond."""


# --------------------------------------------------------------------------- the server side


def main() -> None:
    """Run the fork server, as `host.Sandbox` starts it (`launch.server_command`):
    `python -s -S -B -P runner.py ROOT [--confine]`, where ROOT holds the `shared` package,
    with its stdin one end of a control socket (AF_UNIX, SOCK_SEQPACKET) whose other end the
    host holds."""
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
    control = socket.socket(fileno=os.dup(0))  # the control socket, which the host gave as stdin
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    _quiet.append(open(1, "w", closefd=False))  # noqa: SIM115 - lives as long as the server
    _rehearsal.append(marshal.dumps(compile(REHEARSAL, "rehearsal.py", "exec")))
    spares = Spares(confined)
    _send(control, {"ready": True, "python": sys.version.split()[0], "confinement": status})
    _offer(control, spares)
    serve(control, spares)


def serve(control: socket.socket, spares: Spares) -> None:
    """Answer the host's messages until it goes away; reap stopped children as they die.

    The server manages processes and nothing else; the host talks to the children itself:

    - The server forks children ahead of the requests (`Spares`: a few at a time). When its
      turn comes, a child confines itself (`confine.confine_child`), sets rlimits and rehearses
      with an environment of ours (`_rehearse`), then waits for its work on a pipe.
    - The server hands the host each started child, one at a time: its pid in a JSON message
      `["child", pid]` carrying the write end of its work pipe and the read end of its result
      pipe (SCM_RIGHTS), which the server then closes (`_offer`).
    - The host writes a request's work to that pipe and closes it (`host._work`); the child
      runs it (`_child`) and the host reads, parses and checks each result line. The host
      enforces the per-operation time limit and the output cap, and takes a fresh child for the
      remaining operations when one dies, overruns or writes anything else.
    - The host tells the server, in marshal messages `(what, pid)`: "took" (it wrote a child's
      work: the server starts the next child, forking more when none is left, while this one
      works), "stop" (done with it, or it overran: SIGKILL it; the server reaps it once it has
      finished dying, which takes about a millisecond, while it waits for the next message) and
      "reap" (its pipe closed early: kill it, reap it, and answer `["status", pid, kind,
      error]` with how it died).

    So a request's work and results go straight between the host and the child, and the server
    does its part (starting the next child, killing the last) beside them. The server itself
    never runs environment code and never reads what a child writes. A child can only forge the
    results of its own request (it is the code being judged, so that gives it nothing its
    routines could not do); it cannot touch the server, other children, later requests or the
    host. The one thing a child hands the host beyond its results, its compiled module for the
    host's code cache (`_send_code`), is written before any environment code runs in it, and
    only later children unmarshal it.
    """
    fd = control.fileno()
    while True:
        ready, _, _ = select.select([fd, *_stopped.values()], [], [])
        _reap_dead(ready)
        if fd not in ready:
            continue
        message = control.recv(MESSAGE_BYTES)
        if not message:
            return  # the host went away: so does the sandbox, and with it every child
        try:
            what, pid = marshal.loads(message)
        except (ValueError, EOFError, TypeError):
            continue
        if pid not in _offered:
            continue  # not a child the host holds: nothing to do
        if what == "took":
            _offer(control, spares)
        elif what == "stop":
            _offered.discard(pid)
            _stop(pid)
        elif what == "reap":
            _offered.discard(pid)
            kind, _, error = _kill(pid)
            _send(control, ["status", pid, kind, error])


def _send(control: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(control, [data], fds)
    else:
        control.send(data)


_offered: set[int] = set()
"""Children whose pipes the host holds, until it says "stop" or "reap"."""


def _offer(control: socket.socket, spares: Spares) -> None:
    """Hand the host the next started child: its pid, and its two pipes, which the server then
    closes (so the host's write end is the only one, and the child reads its work to EOF)."""
    pid, work_fd, result_fd = spares.take()
    _offered.add(pid)
    try:
        _send(control, ["child", pid], [work_fd, result_fd])
    finally:
        os.close(work_fd)
        os.close(result_fd)


class Spares:
    """Children forked ahead of their requests; the next one confined and ready.

    Forking a child and confining it (rlimits, Landlock, seccomp) is most of a request's fixed
    cost, and none of it depends on the request. So the server keeps the next child started
    before its request comes: forked, confined and waiting for its work on a pipe, with no
    environment code run in it. The host takes it (`_offer`), writes it the work and says so,
    and the server hands it the next one and starts another while this one runs (on another
    core, or while the host waits anyway). A child serves one request.

    Besides the child the host holds, `STARTED` more are started: getting ready (confining
    itself and rehearsing) costs a child about as much CPU as grading a group of 512 answers,
    so with one child started per request the next request could find its child still
    rehearsing. One more in hand: 512-answer calls back to back took ~5% less time (median of
    five interleaved comparisons, 0.88-1.01).

    Children are forked `SPARES` at a time, each then waiting for its turn before it does
    anything: a fork write-protects every page of the server, so each page the server writes
    afterwards costs it a copy (some 50 pages a request here, 2-4 us each), once per
    fork; after forking several in a row it pays that once for all of them. They are started
    one at a time, as the host takes them, so the work of getting ready never competes with
    more than one request.
    """

    def __init__(self, confined: bool) -> None:
        self.confined = confined
        self.forked: list[tuple[int, int, int]] = []
        """Children waiting for their turn: (pid, the write end of its work pipe, the read end
        of its result pipe)."""
        self.started: list[tuple[int, int, int]] = []
        """Children started for the next requests, oldest first."""

    def take(self) -> tuple[int, int, int]:
        """The oldest started child, now the caller's; start more, up to `STARTED` (forking
        more first, if none is left)."""
        while len(self.started) < STARTED + 1:
            if not self.forked:
                self.forked = [_fork_child(self.confined) for _ in range(SPARES)]
            child = self.forked.pop()
            try:
                os.write(child[1], _START)
            except BrokenPipeError:
                pass  # it died waiting: handing it its work fails, and another is taken
            self.started.append(child)
        return self.started.pop(0)


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


_stopped: dict[int, int] = {}
"""Children `_stop` killed and not reaped yet: pid -> a pidfd, readable once it is dead."""
MAX_DYING = 8
"""Killed children the server lets die in the background; one more, and it waits for them."""


def _stop(pid: int) -> None:
    """SIGKILL a child that needs no post-mortem: it can run nothing more, so the request
    goes on while the kernel tears it down (a millisecond for a process this size), and the
    server reaps it later (`serve`, `_reap_dead`)."""
    _sigkill(pid)
    if len(_stopped) >= MAX_DYING:
        _reap_dead(list(_stopped.values()))
    try:
        _stopped[pid] = os.pidfd_open(pid)
    except OSError:  # out of descriptors: wait for it now
        os.waitpid(pid, 0)


def _reap_dead(ready: list[int]) -> None:
    """Reap the stopped children whose pidfd is in `ready`: at once if dead, as `select` says
    they are in `serve`; after the end of their teardown if not."""
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
    wait for its work, run it, write the results, exit.

    The work is marshal, read to the end of the pipe; the child then sets the request's own
    limits, loads the environment source and runs the request's operations in order
    (`run_op`), writing one JSON line per operation to its result pipe.

    Limits: "op_seconds" bounds each op of a request (the wall-clock time from the previous
    result line to this op's line, which the host enforces) and, times the number of ops, the
    child's CPU time; "memory_mb" is the child's address-space limit; "output_bytes" caps each
    result line. A caller sending a `grade` op with many answers passes a longer "op_seconds"
    for that request (`Sandbox.run`'s `op_seconds`), since the limit applies to the whole op.

    Tampering: after loading the environment's module, and after each op, the child checks
    `Framework.changed`; if the environment changed the framework, that op and every later one
    of the request fail with kind "tamper" and an error that begins `TAMPERED` and names what
    changed.
    """
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
        if not work:  # the host closed its pipe without work: it is going away
            return
        source, filename, batch, limits, code, cacheable = marshal.loads(work)
        del work
        _limit_child(limits, len(batch))
        results = os.fdopen(write_fd, "wb", buffering=0)
        dumps = json.dumps
        framework = Framework()  # what the runner holds, before any environment code runs
        compiled = _compile(source, filename, code)
        if code is None and cacheable:
            _send_code(write_fd, compiled, int(limits.get("output_bytes", 1 << 20)))
        env_or_error = compiled if isinstance(compiled, str) else _load(compiled, filename)
        failed_as = "load"
        if not isinstance(env_or_error, str) and (change := framework.changed()):
            env_or_error, failed_as = f"{TAMPERED}: {change}", "tamper"
        kept: dict[int, dict[str, Any]] = {}
        for index, op in batch:
            if isinstance(env_or_error, str):
                result = _fail(index, failed_as, "load", env_or_error)
            else:
                result = run_op(env_or_error, op, kept, index)
                if change := framework.changed():  # this op's routines did it: no result of
                    env_or_error, failed_as = f"{TAMPERED}: {change}", "tamper"  # theirs counts
                    result = _fail(index, failed_as, str(result.get("routine", "")), env_or_error)
                result.pop("i", None)
                result = {"i": index, **result}  # the line begins {"i":N,"ok": (RESULT_PREFIX)
            try:
                line = dumps(result, separators=(",", ":"), default=_unencodable, allow_nan=False)
            except (ValueError, RecursionError):
                line = dumps(
                    _fail(
                        index, "type", result.get("routine", ""), "result cannot be encoded as JSON"
                    )
                )
            results.write(line.encode("utf-8", "replace") + b"\n")
    finally:
        os._exit(0)


TAMPERED = "the environment modified the framework"
"""How a result begins when the environment changed what the runner relies on."""
GUARDED_MODULES = (
    "builtins",
    "shared",
    "shared.environment",
    "json",
    "json.decoder",
    "json.encoder",
    "json.scanner",
    "marshal",
    "confine",
)
"""Modules whose contents the runner relies on in a child, besides its own (`Framework`)."""


class Framework:
    """What the runner holds of its own module and of `GUARDED_MODULES`, taken before any
    environment code runs in the child: `changed` tells whether the modules still expose
    exactly those objects (the runner looks some of them up at every call: `grade_value`).

    Environment code can reach every object of its process (through module attributes, or
    `string.Formatter` field lookups on names built at run time), this one included, so this
    detects tampering without preventing it: what keeps a child from forging anything beyond
    its own request's results is the host, which checks every result (`results.py`)."""

    def __init__(self) -> None:
        self.held = [
            (name, module, list(vars(module)), list(vars(module).values()))
            for name in (__name__, *GUARDED_MODULES)
            if (module := sys.modules.get(name)) is not None
        ]

    def changed(self) -> str | None:
        """What was changed (a module replaced, a name rebound, added or removed), or None."""
        modules = sys.modules
        for name, module, keys, values in self.held:
            shown = "the runner" if name == __name__ else name
            if modules.get(name) is not module:
                return f"sys.modules[{name!r}] was replaced"
            now = vars(module)
            if list(now) == keys and all(map(operator.is_, now.values(), values)):
                continue
            for key, value in zip(keys, values, strict=True):
                if key not in now:
                    return f"{shown}.{key} was removed"
                if now[key] is not value:
                    return f"{shown}.{key} was replaced"
            added = next((str(key) for key in now if key not in keys), "?")
            return f"{shown}.{added[:60]} was added"
        return None


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
    """The module's code object (from the host's cache when it has it), or an error."""
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
    this process, so what the host keeps depends on the source alone; the host takes the
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
    """Run one operation on a loaded environment; never raises. `kept` holds instance results.

    Operations (each a dict with "op"):

    - describe: the class attributes of the environment.
    - instance {seed, difficulty}: sample, solve, render, answer_text for one instance (an
      instance or reference that does not survive JSON unchanged goes as {} or null,
      `_sendable`).
    - score {answer, from: k} or {answer, instance, reference}: score one extracted answer
      against the instance of operation k of the same request, or against the given instance.
      With "from" and a null answer, the answer is that instance's own answer_text, stripped.
    - answer_text {reference}: how the environment writes a given reference.
    - solve {instance}: solve and answer_text for a given instance (the reference this
      environment gives another environment's instance: admission's same-oracle check). Its
      value is {"reference", "answer_text"}.
    - grade {seed, difficulty, answers: [str | null | probe, ...], cap}: the batched grading
      path (`_grade`); a probe is filled in by the child (`_fill_probes`).

    The child writes every result as {"i", "ok", ...}: ok results carry "value" (and
    "seconds"); failed ones carry "kind" (exception, type, value, timeout, memory, crash,
    output, load, dependency, skipped, tamper), "routine" and "error".
    """
    kind = op.get("op") if isinstance(op, dict) else None
    if kind == "describe":
        return _describe_env(env)
    if kind == "instance":
        result = _instance(env, op)
        if result["ok"]:
            kept[index] = result["value"]
            result = {**result, "value": _sendable(result["value"])}
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


def _sendable(value: dict[str, Any]) -> dict[str, Any]:
    """An instance op's value as the host gets it: an instance or reference that does not
    survive JSON unchanged (which L2 rejects: `round_trip` says so) goes as {} or null, since
    JSON may not even write it (NaN, infinities, integers past Python's digit limit)."""
    trips = value["round_trip"]
    if trips["instance"] and trips["reference"]:
        return value
    return {
        **value,
        "instance": value["instance"] if trips["instance"] else {},
        "reference": value["reference"] if trips["reference"] else None,
    }


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
    """Sample and solve one instance, then score every non-null answer of `op` against it.

    The instance is made as the `instance` op makes it (sample, solve, render, answer_text).
    The value is {"scores": [float], "outcomes": [int | null], "errors": {position: str},
    "prompt", "answer_text"}: "scores" holds each distinct reward once, and "outcomes" has one
    entry per answer, the index in "scores" of its reward (JSON reads an int several times
    faster than a float, and a group has few distinct rewards). A null answer has a null
    outcome; an answer whose scorer raised, ran out of memory or returned something that is not
    a number in [0, 1] has a null outcome and its error in words in "errors" under its position
    (a string: JSON keys are strings). Those are per-answer failures: the op still succeeds.

    An answer may also be a probe, {"probe": "reference" | "empty" | "perturbed"}, which the
    child puts in place before any answer is scored (`_fill_probes`), in the list itself: the
    scorer sees a probe as one more answer, and the host reads its outcome at its position.

    The op fails (like `instance`) only when sampling, solving, rendering or answer_text fails,
    or when `answers` is not a list; and, like any op, when the whole op overruns the time
    limit, runs the child out of memory or kills it: then no answer of it has a reward. Each
    score call gets its own copy of the instance and the reference, as the `score` op does. Its
    "seconds" has sample, solve, render, answer_text, and score for all the answers together.
    """
    from shared.environment import grade_value

    answers = op.get("answers")
    if not isinstance(answers, list):
        return _fail(-1, "type", "score", "answers must be a list of strings and nulls")
    made = _instance(env, op)
    if not made["ok"]:
        return made
    value = made["value"]
    if any(type(answer) is dict for answer in answers):
        _fill_probes(env, value, answers, op.get("cap"))
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


def _fill_probes(env: Any, value: dict[str, Any], answers: list[Any], cap: Any) -> None:
    """Put each probe of `answers` in its place, as a solver's extracted answer (a null where
    it has no text): "reference" is the instance's answer_text, "empty" the empty answer and
    "perturbed" the first near miss of the reference (`perturbations`, the last one first: for
    a list, its last scalar changed) that the environment's `answer_text` (else
    `default_answer_text`) writes as another answer than the reference's. The empty and the
    perturbed answers are null where they read as the reference."""
    from shared.environment import ANSWER_CAP, default_answer_text, extract_answer, perturbations

    limit = cap if type(cap) is int else ANSWER_CAP
    reference = extract_answer(f"<answer>{value['answer_text']}</answer>", limit).answer
    texts: dict[str, str | None] = {"reference": reference, "empty": None, "perturbed": None}
    if reference != "":
        texts["empty"] = ""
    wanted = any(type(a) is dict and a.get("probe") == "perturbed" for a in answers)
    for near in reversed(perturbations(value["reference"]) if wanted else []):
        try:
            text = env.answer_text(_copy(near, True))
        except BaseException:  # noqa: BLE001 - written the framework's way instead, as L5 does
            text = None
        if type(text) is not str:
            try:
                text = default_answer_text(near)
            except ValueError:  # an integer past Python's digit limit for `str`
                continue
        extracted = extract_answer(f"<answer>{text}</answer>", limit).answer
        if extracted is not None and extracted != reference:
            texts["perturbed"] = extracted
            break
    for position, answer in enumerate(answers):
        if type(answer) is dict:
            answers[position] = texts.get(str(answer.get("probe")))


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
