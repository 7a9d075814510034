"""What the host makes of a child's result lines (`sandbox/results.py`): checked per op, never
trusted, never raising. No sandbox here: the lines are written by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evoenv_worker.sandbox.results import MAX_DEPTH, MAX_INT_DIGITS, read_result

INSTANCE = {"op": "instance", "seed": 3, "difficulty": 7}
MADE = {
    "instance": {"n": 4},
    "reference": 8,
    "prompt": "Double 4.",
    "answer_text": "8",
    "round_trip": {"instance": True, "reference": True},
    "reference_type": "int",
}
OPS: list[dict[str, Any]] = [
    INSTANCE,
    {"op": "score", "from": 0, "answer": "8"},
    {"op": "describe"},
    {"op": "grade", "seed": 1, "difficulty": 2, "answers": ["1", None, "2"]},
]


BIG = "<an integer of MAX_INT_DIGITS + 1 digits>"
"""Stands for an integer `json.dumps` cannot write here (past Python's digit limit)."""


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def line(index: int, value: Any = None, *, raw: str | None = None, **extra: Any) -> bytes:
    """An ok result line for op `index` with `value` (or the JSON text `raw`)."""
    text = raw if raw is not None else json.dumps(value)
    tail = "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in extra.items())
    return f'{{"i":{index},"ok":true,"value":{text}{tail}}}'.encode()


def test_a_well_formed_result_is_kept_and_a_score_comes_back_as_a_float() -> None:
    made = read_result(line(0, MADE, seconds={"sample": 0.001}), 0, OPS)
    assert made == {"ok": True, "value": MADE, "seconds": {"sample": 0.001}}
    scored = read_result(line(1, True), 1, OPS)
    assert scored["ok"] and scored["value"] == 1.0 and type(scored["value"]) is float


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("NaN", "NaN is not a number JSON allows"),
        ("-Infinity", "-Infinity is not a number JSON allows"),
        ("1e999", "too large for a float"),
        ('"1.0"', "the score is str"),
        ("1.5", "outside [0, 1]"),
        ("-0.0001", "outside [0, 1]"),
        ("null", "the score is null"),
        ("[1.0]", "the score is list"),
        ('{"score": 1.0}', "the score is dict"),
        ("1" * (MAX_INT_DIGITS + 1), f"more than {MAX_INT_DIGITS} digits"),
        ("9" * 5000, "not one JSON value"),  # past Python's own digit limit
    ],
)
def test_a_score_that_is_not_a_number_in_the_unit_interval_fails_its_op(raw: str, why: str) -> None:
    result = read_result(line(1, raw=raw), 1, OPS)
    assert not result["ok"], result
    assert result["kind"] in {"value", "output"}
    assert why in result["error"], result["error"]
    assert result["error"].startswith("op 1 (score, seed 3, difficulty 7): malformed result")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"prompt": 3}, "value.prompt is int, expected str"),
        ({"instance": None}, "value.instance is null, expected dict"),
        ({"answer_text": ["8"]}, "value.answer_text is list, expected str"),
        ({"round_trip": {"instance": True}}, "missing key 'reference' in the round_trip"),
        ({"round_trip": {"instance": 1, "reference": True}}, "round_trip.instance is int"),
        ({"extra": 1}, "unexpected key 'extra'"),
        ({"reference": _nested(MAX_DEPTH)}, f"deeper than {MAX_DEPTH}"),
        ({"reference": BIG}, f"more than {MAX_INT_DIGITS} digits"),
    ],
)
def test_an_instance_value_of_the_wrong_shape_fails_its_op_naming_seed_and_difficulty(
    change: dict[str, Any], why: str
) -> None:
    text = json.dumps({**MADE, **change}).replace(json.dumps(BIG), "1" + "0" * MAX_INT_DIGITS)
    result = read_result(line(0, raw=text), 0, OPS)
    assert (result["ok"], result["kind"]) == (False, "output"), result
    assert why in result["error"], result["error"]
    assert "op 0 (instance, seed 3, difficulty 7)" in result["error"]
    assert "\n" not in result["error"]


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"{",
        b"[]",
        b'{"i":0}',
        b'{"i":0,"ok":1,"value":null}',
        b'{"i":1,"ok":true,"value":null}',  # another op's result
        b'{"i":true,"ok":true,"value":null}',
        b'{"i":0,"ok":true,"value":' + b"[" * 100_000,
        b'{"i":0,"ok":true,"value":' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"i":0,"ok":true,"value":null,"seconds":{"sample":NaN}}',
        b'{"i":0,"ok":true,"value":null,"seconds":{"sample":-1}}',
        b'{"i":0,"ok":false,"kind":"pwned","routine":"","error":""}',
        b'{"i":0,"ok":false,"kind":"exception","routine":"","error":7}',
        b"\xff\xfe\x00garbage",
    ],
)
def test_a_line_that_is_not_the_ops_result_fails_the_op_and_never_raises(text: bytes) -> None:
    result = read_result(text, 0, OPS)
    assert (result["ok"], result["kind"]) == (False, "output"), result
    assert "malformed" in result["error"]


def test_a_reported_failure_keeps_its_kind_and_its_text_is_bounded() -> None:
    text = json.dumps(
        {"i": 0, "ok": False, "kind": "exception", "routine": "sample", "error": "x" * 10_000}
    ).encode()
    result = read_result(text, 0, OPS)
    assert (result["ok"], result["kind"], result["routine"]) == (False, "exception", "sample")
    assert len(result["error"]) == 2000


def test_a_description_holds_scalars_only() -> None:
    attrs = {"name": "x", "description": "d", "oracle": "equality", "min_difficulty": 1}
    assert read_result(line(2, {**attrs, "max_difficulty": 3}), 2, OPS)["ok"]
    nested = read_result(line(2, {**attrs, "max_difficulty": [3]}), 2, OPS)
    assert not nested["ok"] and "description.max_difficulty is list" in nested["error"]
    missing = read_result(line(2, attrs), 2, OPS)
    assert not missing["ok"] and "missing key 'max_difficulty'" in missing["error"]


GRADED = {
    "scores": [1.0, 0.0],
    "outcomes": [0, None, 1],
    "errors": {},
    "prompt": "p",
    "answer_text": "a",
}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"outcomes": [0, None]}, "2 outcomes for 3 answers"),
        ({"outcomes": [0, None, 2]}, "neither null nor an index"),
        ({"outcomes": [0, None, 1.0]}, "neither null nor an index"),
        ({"outcomes": [0, None, True]}, "neither null nor an index"),
        ({"outcomes": [0, None, [1]]}, "neither null nor an index"),
        ({"scores": [1.0, "0"]}, "the score is str"),
        ({"scores": [1.0, 2.0]}, "outside [0, 1]"),
        ({"errors": {"1": None}}, "errors.'1' is null"),
        ({"errors": []}, "value.errors is list"),
    ],
)
def test_a_grade_value_of_the_wrong_shape_fails_the_whole_op(
    change: dict[str, Any], why: str
) -> None:
    result = read_result(line(3, {**GRADED, **change}), 3, OPS)
    assert not result["ok"], result
    assert why in result["error"], result["error"]
    assert "op 3 (grade, seed 1, difficulty 2)" in result["error"]


def test_a_well_formed_grade_value_is_kept() -> None:
    result = read_result(line(3, GRADED), 3, OPS)
    assert result["ok"] and result["value"] == GRADED
