"""What the host makes of a child's result line: nothing in it is trusted (see `read_result`).

A child runs environment code, which can reach everything in its own process, so a result line
says only what the environment wants it to say. Nothing here raises on any line, and nothing
converts an untrusted value without a bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

MAX_DEPTH = 100
"""Deepest nesting of lists and objects accepted in a result."""
MAX_INT_DIGITS = 4000
"""Most decimal digits of an integer in a result (Python's own limit for `str` is 4,300)."""
MAX_ERROR_CHARS = 2000
"""A failure's text is cut to this many characters."""
KINDS = frozenset(
    {
        "exception",
        "type",
        "value",
        "timeout",
        "memory",
        "crash",
        "output",
        "load",
        "dependency",
        "skipped",
        "tamper",
    }
)
"""The kinds of failure a child may report (see `host.OpResult.kind`)."""

_INT_BOUND = 10**MAX_INT_DIGITS
_SCALARS = (str, int, float, bool, type(None))
_NUMBERS = (bool, int, float)
_DESCRIBED = frozenset({"name", "description", "oracle", "min_difficulty", "max_difficulty"})
_MADE = frozenset(
    {"instance", "reference", "prompt", "answer_text", "round_trip", "reference_type"}
)
_OUTCOME_TYPES = {int, type(None)}
_GRADED = frozenset({"scores", "outcomes", "errors", "prompt", "answer_text"})
_ROUTINE_CHARS = 40
_MAX_TIMINGS = 16


class _Unfit(ValueError):
    """A result the host does not use; the message says why, `kind` how the op failed."""

    def __init__(self, reason: str, kind: str = "output") -> None:
        super().__init__(reason)
        self.kind = kind


def read_result(line: bytes, index: int, ops: Sequence[Any]) -> dict[str, Any]:
    """The checked result of op `index` (of `ops`) in `line`, or that op's failure.

    An ok result is `{"ok": True, "value": ..., "seconds": {...}}`, its value of the shape
    the op promises (a score as a float); a failure is `{"ok": False, "kind", "routine",
    "error"}`.

    A child can reach the runner's functions, `shared.environment` and its result pipe, so
    the host checks all of the line before anything uses it:

    - the line is parsed with bounds: `NaN`, `Infinity` and numbers too large for a float are
      refused, and so are integers of more than `MAX_INT_DIGITS` digits (Python refuses to
      read more than 4,300, and arithmetic on the host must leave room to print them) and
      values nested deeper than `MAX_DEPTH`;
    - the result has exactly the keys of its kind, with the types the op promises (see the ops
      in `runner.py`); a score is of type exactly `bool`, `int` or `float` (never a subclass or
      an object posing as one), in [0, 1], and comes back as a float; timings are finite and
      not negative; a failure's kind is one of the runner's, and its text is cut to
      `MAX_ERROR_CHARS`.

    Anything else is that op's failure: kind `output` (or `value` for a score out of range),
    with a one-line reason that names the op, its seed and its difficulty.
    """
    try:
        message = parse(line)
        if type(message) is not dict:
            raise _Unfit("the line is not a JSON object")
        if type(message.get("i")) is not int or message["i"] != index:
            raise _Unfit(f"the line is not the result of op {index}")
        if message.get("ok") is True:
            return _ok(message, ops[index] if 0 <= index < len(ops) else None)
        if message.get("ok") is False:
            return _failed(message)
        raise _Unfit('"ok" is neither true nor false')
    except _Unfit as exc:
        return failure(exc.kind, f"{op_label(ops, index)}: malformed result: {exc}")


def failure(kind: str, error: str, routine: str = "") -> dict[str, Any]:
    """A failed op's result as `read_result` gives it."""
    return {"ok": False, "kind": kind, "routine": routine, "error": error}


def op_label(ops: Sequence[Any], index: int) -> str:
    """The op in words: `op 7 (score, seed 3, difficulty 10)`; a score op of an earlier op's
    instance names that instance's seed and difficulty."""
    op = ops[index] if 0 <= index < len(ops) else None
    if not isinstance(op, dict):
        return f"op {index}"
    where = op
    source = op.get("from")
    if op.get("op") == "score" and type(source) is int and 0 <= source < len(ops):
        where = ops[source] if isinstance(ops[source], dict) else op
    parts = [str(op.get("op"))]
    if "seed" in where:
        parts.append(f"seed {where.get('seed')}, difficulty {where.get('difficulty')}")
    return f"op {index} ({', '.join(parts)})"


def parse(line: bytes) -> Any:
    """One JSON value without NaN or infinities; raises `ValueError` (with the reason)
    otherwise. Its bounds (`unbounded`) are for the caller to check."""
    try:
        return _DECODER.decode(line.decode("utf-8"))
    except _Unfit:
        raise
    except RecursionError:
        raise _Unfit(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer past Python's digit limit
        raise _Unfit(f"not one JSON value ({str(exc)[:200]})") from None


def unbounded(value: Any) -> str | None:
    """Why a parsed JSON value is out of bounds (nesting, integer size, non-finite float), or
    None."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            children = item.values() if kind is dict else item
            stack.extend((child, depth + 1) for child in children)
        elif kind is int:
            if not -_INT_BOUND < item < _INT_BOUND:
                return f"an integer of more than {MAX_INT_DIGITS} digits"
        elif kind is float and not math.isfinite(item):
            return "a number too large for a float"
    return None


def _no_constant(name: str) -> Any:
    raise _Unfit(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""Made once: `json.loads` with an argument makes a decoder at every call."""


# ------------------------------------------------------------------------------ the shapes


def _ok(message: dict[str, Any], op: Any) -> dict[str, Any]:
    extra = message.keys() - {"i", "ok", "value", "seconds"}
    if extra:
        raise _Unfit(f"unexpected key {_brief(min(extra))}")
    kind = op.get("op") if isinstance(op, dict) else None
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise _Unfit(f"no result is expected for an op {_brief(kind)}")
    value = message.get("value")
    # A grade value's check leaves no room for nesting or unbounded numbers, and walking
    # its hundreds of outcomes would cost more than reading them.
    problem = unbounded(value) if kind != "grade" else None
    if problem:
        raise _Unfit(problem)
    value = check(value, op)
    return {"ok": True, "value": value, "seconds": _timings(message.get("seconds", {}))}


def _failed(message: dict[str, Any]) -> dict[str, Any]:
    extra = message.keys() - {"i", "ok", "kind", "routine", "error", "seconds"}
    if extra:
        raise _Unfit(f"unexpected key {_brief(min(extra))}")
    kind, routine, error = message.get("kind"), message.get("routine", ""), message.get("error")
    if type(kind) is not str or kind not in KINDS:
        raise _Unfit(f"unknown kind of failure {_brief(kind)}")
    if type(routine) is not str or len(routine) > _ROUTINE_CHARS:
        raise _Unfit("the failure's routine is not a short string")
    if type(error) is not str:
        raise _Unfit("the failure's error is not a string")
    result = failure(kind, error[:MAX_ERROR_CHARS], routine)
    result["seconds"] = _timings(message.get("seconds", {}))
    return result


def _timings(seconds: Any) -> dict[str, float]:
    if type(seconds) is not dict or len(seconds) > _MAX_TIMINGS:
        raise _Unfit("the timings are not an object of a few numbers")
    timings = {}
    for key, value in seconds.items():
        if (
            len(key) > _ROUTINE_CHARS
            or type(value) not in (int, float)
            or not 0 <= value < math.inf  # NaN fails both comparisons
        ):
            raise _Unfit(f"the timing {_brief(key)} is not a non-negative number")
        timings[key] = float(value)
    return timings


def _keys(value: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Unfit(f"the {what} is {_type(value)}, expected an object")
    if value.keys() != keys:
        odd = sorted(value.keys() ^ keys)[0]
        side = "unexpected" if odd in value else "missing"
        raise _Unfit(f"{side} key {_brief(odd)} in the {what}")
    return value


def _typed(value: dict[str, Any], key: str, kind: type, what: str) -> None:
    if type(value[key]) is not kind:
        raise _Unfit(f"{what}.{key} is {_type(value[key])}, expected {kind.__name__}")


def score(value: Any) -> float:
    """A score as a float: exactly a bool, an int or a float, in [0, 1]; raises `ValueError`."""
    if type(value) not in _NUMBERS:
        raise _Unfit(f"the score is {_type(value)}, expected a number in [0, 1]", "value")
    if not 0 <= value <= 1:  # NaN fails both comparisons
        raise _Unfit(f"the score {_brief(value)} is outside [0, 1]", "value")
    return float(value)


def _describe(value: Any, op: Any) -> Any:
    attrs = _keys(value, _DESCRIBED, "description")
    for key, item in attrs.items():
        if type(item) not in _SCALARS:
            raise _Unfit(f"description.{key} is {_type(item)}, expected a string or a number")
    return attrs


def _instance(value: Any, op: Any) -> Any:
    made = _keys(value, _MADE, "instance value")
    _typed(made, "instance", dict, "value")
    for key in ("prompt", "answer_text", "reference_type"):
        _typed(made, key, str, "value")
    trips = _keys(made["round_trip"], frozenset({"instance", "reference"}), "round_trip")
    for key in trips:
        _typed(trips, key, bool, "round_trip")
    return made


def _score(value: Any, op: Any) -> Any:
    return score(value)


def _answer_text(value: Any, op: Any) -> Any:
    if type(value) is not str:
        raise _Unfit(f"the answer text is {_type(value)}, expected str")
    return value


def _solve(value: Any, op: Any) -> Any:
    solved = _keys(value, frozenset({"reference", "answer_text"}), "solve value")
    _typed(solved, "answer_text", str, "value")
    return solved


def _grade(value: Any, op: Any) -> Any:
    graded = _keys(value, _GRADED, "grade value")
    for key, kind in (("scores", list), ("outcomes", list), ("errors", dict), ("prompt", str)):
        _typed(graded, key, kind, "value")
    _typed(graded, "answer_text", str, "value")
    scores = [score(item) for item in graded["scores"]]
    answers = op.get("answers")
    if isinstance(answers, list) and len(graded["outcomes"]) != len(answers):
        raise _Unfit(f"{len(graded['outcomes'])} outcomes for {len(answers)} answers")
    # Each outcome is null or an index of "scores" (sets compare them at C speed: a group
    # has hundreds of answers).
    outcomes = graded["outcomes"]
    if not (
        set(map(type, outcomes)) <= _OUTCOME_TYPES and set(outcomes) <= {None, *range(len(scores))}
    ):
        raise _Unfit("an outcome is neither null nor an index of the scores")
    for key, error in graded["errors"].items():
        if type(error) is not str:
            raise _Unfit(f"errors.{_brief(key)} is {_type(error)}, expected str")
    graded["scores"] = scores
    return graded


_CHECKS: dict[str, Callable[[Any, Any], Any]] = {
    "describe": _describe,
    "instance": _instance,
    "score": _score,
    "answer_text": _answer_text,
    "solve": _solve,
    "grade": _grade,
}


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _brief(value: Any) -> str:
    """A short, bounded repr of a checked JSON value (no integer of it is unbounded)."""
    if type(value) in (list, dict):
        return f"a JSON {'array' if type(value) is list else 'object'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
