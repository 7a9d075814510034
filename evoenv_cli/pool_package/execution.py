"""Where an exported pool's environment code runs: in EvoEnv's sandbox when the EvoEnv project
is importable (`SandboxRunner`), or in this process when the caller opts in (`InProcessRunner`).
Part of the package `evoenv pool export --format reasoning-gym` writes; standard library only.
"""

from __future__ import annotations

import atexit
import json
import random
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # checked in EvoEnv's tree, where the export's copy does not exist
    from shared import environment as base
else:
    from . import environment as base

BATCH = 256
"""Most operations sent to the sandbox in one request."""
IN_PROCESS_SECONDS = 10.0
"""In-process limit of one routine call (EvoEnv's sandbox default), where a timer can be set:
on the main thread of a Unix process. Elsewhere in-process calls are not timed out."""
INSTANCE_KEYS = ("instance", "reference", "prompt", "answer_text")
"""What a runner gives of each instance."""
_SWAPPED = ("shared", "shared.environment")
"""The module names environment files import the base class from (`from shared.environment
import Environment`): they name this package's copy only while such a file executes."""
_ABSENT = object()


class SandboxNotAvailable(RuntimeError):
    """EvoEnv's sandbox cannot run here; the message says what to do."""


class EnvironmentFailed(RuntimeError):
    """An environment failed to load or to make an instance (not a scorer failure: those give a
    reward of 0.0 with a warning)."""


@dataclass(frozen=True, slots=True)
class Score:
    """One scored answer: `reward` in [0, 1], or None with `error` when the scorer failed."""

    reward: float | None
    error: str = ""


class Runner(Protocol):
    def instances(
        self, name: str, source: str, wanted: list[tuple[int, int]]
    ) -> list[dict[str, Any]]:
        """One {"instance", "reference", "prompt", "answer_text"} per (seed, difficulty)."""
        ...

    def scores(self, name: str, source: str, graded: list[tuple[str, Any, Any]]) -> list[Score]:
        """One score per (answer, instance, reference)."""
        ...


# ----------------------------------------------------------------------------- the sandbox


class SandboxRunner:
    """EvoEnv's sandbox (`evoenv_worker.sandbox.host.Sandbox`, default settings): one per
    process, started on first use, closed at exit. Operations go in batches of `BATCH`."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    def instances(
        self, name: str, source: str, wanted: list[tuple[int, int]]
    ) -> list[dict[str, Any]]:
        ops = [{"op": "instance", "seed": s, "difficulty": d} for s, d in wanted]
        made = []
        for (seed, difficulty), result in zip(wanted, self._run(name, source, ops), strict=True):
            trips = result.value.get("round_trip", {}) if result.ok else {}
            if not result.ok or not (trips.get("instance") and trips.get("reference")):
                why = result.reason if not result.ok else "its output is not JSON"
                raise EnvironmentFailed(
                    f"{name} failed at seed {seed}, difficulty {difficulty}: {why}"
                )
            made.append({k: result.value[k] for k in INSTANCE_KEYS})
        return made

    def scores(self, name: str, source: str, graded: list[tuple[str, Any, Any]]) -> list[Score]:
        ops = [
            {"op": "score", "answer": answer, "instance": instance, "reference": reference}
            for answer, instance, reference in graded
        ]
        return [
            Score(float(r.value)) if r.ok else Score(None, r.reason)
            for r in self._run(name, source, ops)
        ]

    def _run(self, name: str, source: str, ops: list[dict[str, Any]]) -> list[Any]:
        results = []
        for start in range(0, len(ops), BATCH):
            batch = ops[start : start + BATCH]
            results += self.sandbox.run(source, batch, filename=f"{name}.py")
        return results


_sandbox_lock = threading.Lock()
_sandbox_runner: list[SandboxRunner] = []


def sandbox_runner() -> SandboxRunner:
    """The process's sandbox runner; `SandboxNotAvailable` when EvoEnv is not importable here
    or its sandbox cannot start."""
    with _sandbox_lock:
        if _sandbox_runner:
            return _sandbox_runner[0]
        try:
            from evoenv_worker.sandbox.host import Sandbox
            from shared.config import SandboxSettings
            from shared.errors import SandboxUnavailable
        except ImportError as exc:
            raise SandboxNotAvailable(
                "evoenv_pool runs environment code in EvoEnv's sandbox, and the EvoEnv project "
                f"is not importable here ({exc}): install EvoEnv in this Python environment, "
                "or pass in_process=True to run the environments' code in this process "
                "without isolation"
            ) from None
        sandbox = Sandbox(SandboxSettings())
        try:
            sandbox.start()
        except SandboxUnavailable as exc:  # the message says what is missing
            raise SandboxNotAvailable(
                f"EvoEnv's sandbox cannot start here: {exc} (or pass in_process=True to run "
                "the environments' code in this process without isolation)"
            ) from exc
        atexit.register(sandbox.close)
        _sandbox_runner.append(SandboxRunner(sandbox))
        return _sandbox_runner[0]


# ----------------------------------------------------------------------------- in process


class _TimedOut(BaseException):
    """Raised into a routine that overran `IN_PROCESS_SECONDS` (a BaseException, so that the
    environment's own `except Exception` does not swallow it)."""


class InProcessRunner:
    """Environment code run in this process, WITHOUT isolation: for trusted exports only (the
    caller's `in_process=True`). It does what EvoEnv's sandbox runner does around the routines
    (seeding, a JSON copy of the instance and reference for each routine, checking scores) and
    leaves the global `random` state as it found it."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()

    def instances(
        self, name: str, source: str, wanted: list[tuple[int, int]]
    ) -> list[dict[str, Any]]:
        env = self._environment(name, source)
        made = []
        for seed, difficulty in wanted:
            try:
                made.append(_instance(env, name, seed, difficulty))
            except (Exception, _TimedOut) as exc:  # noqa: BLE001 - the environment failed
                raise EnvironmentFailed(
                    f"{name} failed at seed {seed}, difficulty {difficulty}: {_describe(exc)}"
                ) from None
        return made

    def scores(self, name: str, source: str, graded: list[tuple[str, Any, Any]]) -> list[Score]:
        env = self._environment(name, source)
        return [_score(env, *item) for item in graded]

    def _environment(self, name: str, source: str) -> Any:
        with self._lock:
            key = (name, source)
            if key not in self._loaded:
                self._loaded[key] = load_environment(name, source)
            return self._loaded[key]


def load_environment(name: str, source: str) -> Any:
    """Execute an environment file with `shared.environment` naming this package's copy of the
    base module, then put back whatever `shared` and `shared.environment` named before (EvoEnv's
    own package, or nothing), so this package never shadows EvoEnv's `shared`."""
    module = types.ModuleType(f"{__package__}.loaded.{name}")
    module.__file__ = f"{name}.py"
    alias = types.ModuleType("shared")
    alias.__path__ = []
    alias.environment = base  # type: ignore[attr-defined]
    saved = {key: sys.modules.get(key, _ABSENT) for key in _SWAPPED}
    sys.modules["shared"], sys.modules["shared.environment"] = alias, base
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    except Exception as exc:  # noqa: BLE001 - whatever the file does at import is its failure
        raise EnvironmentFailed(f"{name} cannot be loaded: {_describe(exc)}") from None
    finally:
        for key, value in saved.items():
            if value is _ABSENT:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value  # type: ignore[assignment]
    classes = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, base.Environment)
        and value is not base.Environment
        and value.__module__ == module.__name__
    ]
    if len(classes) != 1:
        raise EnvironmentFailed(f"{name}: expected one Environment subclass, found {len(classes)}")
    return classes[0]()


def _instance(env: Any, name: str, seed: int, difficulty: int) -> dict[str, Any]:
    state = random.getstate()
    try:
        with _time_limit():
            rng = base.make_rng(name, seed, difficulty)
            base.seed_global_random(name, seed, difficulty)
            instance = env.sample(rng, difficulty)
            if not isinstance(instance, dict) or not base.json_round_trips(instance):
                raise TypeError("sample must return a JSON object that round-trips")
            reference = env.solve(_copy(instance))
            if not base.json_round_trips(reference):
                raise TypeError("solve must return a JSON value that round-trips")
            prompt = env.render(_copy(instance))
            text = env.answer_text(_copy(reference))
    finally:
        random.setstate(state)
    if not isinstance(prompt, str) or not isinstance(text, str):
        raise TypeError("render and answer_text must return strings")
    return {"instance": instance, "reference": reference, "prompt": prompt, "answer_text": text}


def _score(env: Any, answer: str, instance: Any, reference: Any) -> Score:
    try:
        with _time_limit():
            value = env.score(_copy(instance), _copy(reference), answer)
    except (Exception, _TimedOut) as exc:  # noqa: BLE001 - a failed score, reported as one
        return Score(None, f"score raised {_describe(exc)}")
    grade = base.grade_value(value)
    return Score(grade.reward, grade.detail)


@contextmanager
def _time_limit() -> Iterator[None]:
    """Raise `_TimedOut` into the body after `IN_PROCESS_SECONDS`, where a timer can be set. A
    timer the caller had set (pytest-timeout's, say) is set again afterwards, less the time
    spent here."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _TimedOut(f"no result within {IN_PROCESS_SECONDS:g} s")

    handler = signal.signal(signal.SIGALRM, expire)
    delay, interval = signal.setitimer(signal.ITIMER_REAL, IN_PROCESS_SECONDS)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if delay > 0:
            left = delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)


def _copy(value: Any) -> Any:
    """Each routine gets its own copy, as in the sandbox."""
    return json.loads(json.dumps(value))


def _describe(exc: BaseException) -> str:
    text = str(exc)[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_in_process = InProcessRunner()


def runner(in_process: bool) -> Runner:
    """The sandbox, or this process when `in_process` (the caller's explicit opt-in)."""
    if in_process:
        return _in_process
    return sandbox_runner()
