"""A fuzz test of the boundary between a child's output and the host (hypothesis).

What a child writes is untrusted: result lines of every shape (wrong types, NaN, infinities,
huge integers, deep nesting, float and bool impostors, missing and extra keys, lines split or
merged) go through the host's reader (`Sandbox._collect` on a real pipe, `results.read_result`)
and on into the stages (`validate_source`, with a stand-in for the sandbox whose results are
a well-behaved environment's, some of them replaced by fuzzed lines) and into grading
(`grade_group`). No sandbox process runs. Nothing may raise: each line ends as a checked
result or a failed op, each file as admitted or rejected (never `error`), each group graded.

The examples are derandomised under CI (the `ci` hypothesis profile, `conftest.py`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evoenv_worker import mechanical
from evoenv_worker.grade import grade_group, read_grades
from evoenv_worker.sandbox.host import OpResult, Sandbox, _Child, _to_result
from evoenv_worker.sandbox.results import KINDS, MAX_DEPTH, MAX_INT_DIGITS, read_result
from shared.config import PoolSettings, Settings
from shared.messages import CompletionRecord, EnvRef, SolverJob

SOUND = Path(__file__).resolve().parent / "corpus" / "sound" / "int_score_count_distinct.py"
SETTINGS = Settings(validation={"secret": "the fuzz tests' validation secret"})
"""The validation seeds, and so the ops of a validation (`OPS`), derive from the secret."""
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ------------------------------------------------------------------------- what is written


def _deep(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + "1" + close * depth


SPECIAL = [
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e400",
    "1" * MAX_INT_DIGITS,
    "1" * (MAX_INT_DIGITS + 1),
    "9" * 4300,
    "-" + "9" * 4301,
    "7" * 6000,
    _deep(MAX_DEPTH - 3),
    _deep(MAX_DEPTH + 1),
    _deep(1000),
    _deep(5000),
    '{"a":' * 150 + "1" + "}" * 150,
    '"1.0"',
    '"NaN"',
    "true",
    "false",
    "1",
    "0",
    "1.0",
    "0.5",
    "-0.0",
    "1.0000000000000002",
    "2",
    "-1",
    "null",
    "[]",
    "{}",
    "[1.0]",
    '{"__class__": "bool", "value": NaN}',
    '""',
    '"' + "x" * 5000 + '"',
]
"""JSON (and not-quite-JSON) texts a child might put where a value goes."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
fragments = st.one_of(st.sampled_from(SPECIAL), json_values.map(json.dumps))
"""The text of a value in a result line."""


@st.composite
def fuzzed_line(draw: st.DrawFn, index: int, good: Any) -> bytes:
    """A result line for op `index`, whose well-formed value would be `good`, gone wrong."""
    how = draw(st.sampled_from(["value", "field", "missing", "extra", "line", "failure", "bytes"]))
    value = json.dumps(good)
    if how == "value":
        value = draw(fragments)
    elif how == "field" and isinstance(good, dict) and good:
        key = draw(st.sampled_from(sorted(good)))
        value = json.dumps({**good, key: "\0"}).replace('"\\u0000"', draw(fragments), 1)
    elif how == "missing" and isinstance(good, dict) and good:
        key = draw(st.sampled_from(sorted(good)))
        value = json.dumps({k: v for k, v in good.items() if k != key})
    elif how == "extra":
        extra = draw(st.text(max_size=8))
        if isinstance(good, dict):
            value = json.dumps({**good, extra: 1})
        else:
            return _line(f'{{"i":{index},"ok":true,"value":{value},{json.dumps(extra)}:1}}')
    elif how == "line":
        ok = draw(st.sampled_from(["true", "1", '"true"', "null"]))
        i = draw(st.sampled_from([str(index), str(index + 1), "true", f'"{index}"', "-1"]))
        seconds = draw(st.sampled_from(["", ',"seconds":{"sample":NaN}', ',"seconds":[]']))
        return _line(f'{{"i":{i},"ok":{ok},"value":{value}{seconds}}}')
    elif how == "failure":
        kind = draw(st.sampled_from([*sorted(KINDS), "pwned", ""]))
        error = draw(fragments)
        return _line(
            f'{{"i":{index},"ok":false,"kind":{json.dumps(kind)},"routine":"score",'
            f'"error":{error}}}'
        )
    elif how == "bytes":
        return draw(st.binary(max_size=64)).replace(b"\n", b" ")
    text = _line(f'{{"i":{index},"ok":true,"value":{value}}}')
    cut = draw(st.integers(0, 3))
    return text[: len(text) - cut] if cut < 3 else text  # sometimes cut short


def _line(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


# ---------------------------------------------------------- a well-behaved environment, modelled


def _made(seed: int, difficulty: int) -> dict[str, Any]:
    values = [(seed * 7 + k * 3) % 13 for k in range(2 + 2 * difficulty)]
    total = sum(values)
    return {
        "instance": {"values": values},
        "reference": total,
        "prompt": f"What is the sum of {', '.join(map(str, values))}? Give one integer.",
        "answer_text": str(total),
        "round_trip": {"instance": True, "reference": True},
        "reference_type": "int",
    }


DESCRIBED = {
    "name": "summed",
    "description": "Add up some numbers.",
    "oracle": "equality",
    "min_difficulty": 1,
    "max_difficulty": 10,
}


def good_value(ops: list[dict[str, Any]], index: int) -> Any:
    """What a well-behaved environment's op `index` gives (its scorer: equal to the sum)."""
    op = ops[index]
    kind = op["op"]
    if kind == "describe":
        return DESCRIBED
    if kind == "instance":
        return _made(op["seed"], op["difficulty"])
    if kind == "answer_text":
        return str(op["reference"])
    if kind == "score":
        if op.get("from") is not None:
            source = ops[op["from"]]
            text = _made(source["seed"], source["difficulty"])["answer_text"]
        else:
            text = str(op["reference"])
        return 1.0 if op["answer"] is None or op["answer"] == text else 0.0
    raise AssertionError(f"the stages sent an op the model does not know: {kind}")


OPS = 743
"""Ops one validation of the stand-in runs, L2 to L5 (describe first, L5's probes last)."""


class StandIn:
    """A sandbox stand-in: each op's line is the model's, or the fuzzed one planned for it;
    every line goes through the host's reader, as a child's would."""

    def __init__(self, draw: st.DrawFn, planned: set[int]) -> None:
        self.draw = draw
        self.planned = planned
        self.count = 0
        self.isolated = True
        self.settings = SETTINGS.sandbox

    def run(self, source: str, ops: list[dict[str, Any]], **_: Any) -> list[OpResult]:
        results = []
        for index in range(len(ops)):
            good = good_value(ops, index)
            if self.count in self.planned:
                line = self.draw(fuzzed_line(index, good))
            else:
                line = _line(json.dumps({"i": index, "ok": True, "value": good}))
            self.count += 1
            results.append(_to_result(read_result(line, index, ops)))
        return results


def _check(result: OpResult) -> None:
    """What every result the host hands on holds, whatever the line was."""
    if not result.ok:
        assert result.kind in KINDS | {"output", "value"}, result
        assert isinstance(result.error, str) and "\n" not in result.error
        return
    for seconds in result.seconds.values():
        assert type(seconds) is float and math.isfinite(seconds) and seconds >= 0


# ----------------------------------------------------------------------------------- tests

READER_OPS: list[dict[str, Any]] = [
    {"op": "describe"},
    {"op": "instance", "seed": 4, "difficulty": 9},
    {"op": "score", "from": 1, "answer": "3"},
    {"op": "answer_text", "reference": 3},
    {"op": "score", "answer": "1", "instance": {"values": [1]}, "reference": 1},
]


@FUZZ
@given(data=st.data())
def test_the_reader_turns_any_line_into_a_checked_result_or_a_failed_op(data: Any) -> None:
    index = data.draw(st.integers(0, len(READER_OPS) - 1))
    line = data.draw(fuzzed_line(index, good_value(READER_OPS, index)))
    result = _to_result(read_result(line, index, READER_OPS))
    _check(result)
    if result.ok and READER_OPS[index]["op"] == "score":
        assert type(result.value) is float and 0.0 <= result.value <= 1.0
    if result.ok and READER_OPS[index]["op"] == "instance":
        assert isinstance(result.value["prompt"], str), result


class _Reader(Sandbox):
    """The host's reading of a child's pipe (`_collect`), with no fork server to talk to."""

    def _tell(self, what: str, pid: int, *, quiet: bool = False) -> None:
        pass

    def _reap(self, pid: int) -> dict[str, Any]:
        return {"ok": False, "kind": "crash", "routine": "", "error": "the pipe closed"}


@FUZZ
@given(data=st.data())
def test_lines_split_or_merged_on_the_pipe_end_as_results_or_failed_ops(data: Any) -> None:
    ops = READER_OPS
    lines = [
        data.draw(st.one_of(fuzzed_line(k, good_value(ops, k)), st.just(None)))
        or _line(json.dumps({"i": k, "ok": True, "value": good_value(ops, k)}))
        for k in range(len(ops))
    ]
    stream = b"".join(line + b"\n" for line in lines)
    for _ in range(data.draw(st.integers(0, 3))):  # merge two lines, or split one
        at = data.draw(st.integers(0, max(len(stream) - 1, 0)))
        if data.draw(st.booleans()):
            newline = stream.find(b"\n", at)
            if newline >= 0:
                stream = stream[:newline] + stream[newline + 1 :]
        else:
            stream = stream[:at] + b"\n" + stream[at:]
    reader, writer = os.pipe()
    try:
        os.write(writer, stream[:60_000])  # within the pipe's buffer: no reader thread needed
    finally:
        os.close(writer)
    results: list[dict[str, Any] | None] = [None] * len(ops)
    pending = list(range(len(ops)))
    limits = {"op_seconds": 5.0, "output_bytes": 1 << 20}
    box = _Reader(SETTINGS.sandbox)
    finished, failure = box._collect(
        _Child(0, -1, reader), ops, pending, results, limits, None, time.monotonic()
    )
    done = [_to_result(result) for result in results if result is not None]
    assert len(done) == finished
    for result in done:
        _check(result)
    if failure is not None:
        assert failure["ok"] is False and failure["kind"] in KINDS


def _validate_with(stand_in: Any) -> Any:
    """The sound file validated with every sandbox call (fresh processes too) on `stand_in`."""

    @contextmanager
    def fresh(hash_seed: int) -> Iterator[Any]:
        yield mechanical.SourceRunner(stand_in, "", "fuzzed.py")

    with mock.patch.object(mechanical, "_fresh_factory", lambda *args: fresh):
        return mechanical.validate_source(SOUND.read_bytes(), "fuzzed.py", stand_in, SETTINGS)


@FUZZ
@given(data=st.data())
def test_no_result_makes_validation_raise_or_blame_the_project(data: Any) -> None:
    planned = set(data.draw(st.lists(st.integers(0, OPS - 1), min_size=1, max_size=3)))
    stand_in = StandIn(data.draw, planned)
    report = _validate_with(stand_in)
    assert report.verdict in {"admitted", "rejected"}, report.error
    if report.verdict == "rejected":
        failed = report.stages[-1]
        assert not failed.ok and failed.detail and "\n" not in failed.detail


def test_the_stand_in_environment_is_admitted_when_nothing_is_fuzzed() -> None:
    """So that fuzzed results reach every stage, the stand-in passes all of them untouched."""
    stand_in = StandIn(lambda strategy: None, set())
    report = _validate_with(stand_in)
    assert report.verdict == "admitted", [(s.stage, s.detail) for s in report.stages]
    assert stand_in.count == OPS  # so the fuzzed op numbers above reach every stage


GRADE_OP = {"op": "grade", "seed": 1, "difficulty": 2, "answers": ["3", None, "x", "5"]}
GRADED = {
    "scores": [1.0, 0.0],
    "outcomes": [0, None, None, 1],
    "errors": {"2": "score raised ValueError"},
    "prompt": "p",
    "answer_text": "3",
}


@FUZZ
@given(data=st.data())
def test_any_grade_result_ends_as_a_graded_group(data: Any) -> None:
    line = data.draw(
        st.one_of(
            fuzzed_line(0, GRADED),
            st.just(_line(json.dumps({"i": 0, "ok": True, "value": GRADED}))),
        )
    )
    result = _to_result(read_result(line, 0, [GRADE_OP]))
    _check(result)
    grades, reason = read_grades(result, GRADE_OP["answers"])
    assert bool(reason) != bool(grades)

    class OneResult:
        def run(self, *args: Any, **kwargs: Any) -> list[OpResult]:
            return [result]

    texts = ["<answer>3</answer>", "none", "<answer>x</answer>", "<answer>5</answer>"]
    job = SolverJob(
        run="fuzz",
        group_id="group",
        env=EnvRef(name="summed", sha="0" * 64, source=""),
        seed=1,
        difficulty=2,
        group_size=len(texts),
        prompt="p",
        completions=[CompletionRecord(text=text) for text in texts],
    )
    unprobed = SETTINGS.model_copy(update={"pool": PoolSettings(probe_rate=0, rescore_rate=0)})
    group = grade_group(OneResult(), job, unprobed)  # the one result answers the four answers
    for completion in group.completions:
        assert (completion.reward is None) == (completion.outcome == "env_error")
        if completion.reward is not None:
            assert type(completion.reward) is float and 0.0 <= completion.reward <= 1.0
