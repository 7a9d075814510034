"""The framework side of the contract: extraction, grades, seeding, JSON round trips."""

from __future__ import annotations

import random

import pytest

from shared.environment import (
    ANSWER_INSTRUCTION,
    EVAL_SEEDS,
    TRAIN_SEEDS,
    Environment,
    Outcome,
    build_prompt,
    default_answer_text,
    extract_answer,
    extract_lenient,
    grade_value,
    json_round_trips,
    make_rng,
)


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("<answer>42</answer>", "42"),
        ("  <answer>  7, 8 \n</answer> trailing", "7, 8"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last span wins
        ("<answer>a<answer>b</answer>", "b"),  # the innermost opening before the last close
        ("<think>maybe <answer>1</answer></think><answer>3</answer>", "3"),
        ("<think>x</think> no <think>y</think> <answer>5</answer>", "5"),
        ("</think><answer>9</answer>", "9"),  # template-opened thinking
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer_finds_the_last_span_after_thinking(response: str, answer: str) -> None:
    assert extract_answer(response).answer == answer


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        ("the answer is 42", "no <answer>"),
        ("<answer>42", "no <answer>"),
        ("42</answer>", "no <answer>"),
        ("<think>thinking... <answer>1</answer>", "unclosed <think>"),
        ("<think>a</think><answer>1</answer><think>b <answer>2</answer>", "unclosed <think>"),
        ("<think><answer>1</answer></think> nothing after", "no <answer>"),
    ],
)
def test_extract_answer_gives_format_errors(response: str, problem: str) -> None:
    extraction = extract_answer(response)
    assert extraction.answer is None
    assert problem in extraction.problem


def test_extract_answer_caps_the_span() -> None:
    assert extract_answer(f"<answer>{'x' * 4096}</answer>").answer == "x" * 4096
    over = extract_answer(f"<answer>{'x' * 4097}</answer>")
    assert over.answer is None and "cap" in over.problem
    assert extract_answer("<answer>12345</answer>", cap=4).answer is None


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("<answer> 7, 8 </answer> and after: 9", "7, 8"),  # a tagged answer: the strict one
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("<answer></answer>\nAnswer: 3", ""),  # the tags said what the answer is
        ("42", "42"),  # no tags: the last line
        ("reasoning first\n\napple, banana, cherry\n", "apple, banana, cherry"),
        ("The length is 3.", "3"),  # after the last label mark, trailing period dropped
        ("Final answer: **12**", "12"),
        ("so x = 5", "5"),
        ("This is the answer: <word>", "word"),  # copy_word's untagged answers
        ("`3`.", "3"),
        ("3  \n\t \n", "3"),  # trailing whitespace and blank lines
        ("steps...\n<answer>4, 5", "4, 5"),  # an answer cut short before its closing tag
        ("<answer>a\nb", "b"),
        ("6</answer>", "6"),  # a stray closing tag is dropped
        ("<think>maybe 1</think>\nIt is 2", "2"),
        ("<think>a</think>b<think>c</think>\n7", "7"),
        ("</think>9", "9"),  # template-opened thinking
        ("x\n" * 200_000 + "5", "5"),  # a very long completion
    ],
)
def test_extract_lenient_takes_the_tagged_answer_else_the_last_line(
    response: str, answer: str
) -> None:
    assert extract_lenient(response).answer == answer


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        ("", "no text"),
        ("   \n\t\n ", "no text"),
        ("The answer is:", "no text"),
        ("<think>the answer is 3", "unclosed <think>"),  # thinking never ended: as strict
        ("<think>a</think> 3 <think>b", "unclosed <think>"),
        (f"<answer>{'x' * 4097}</answer>", "cap"),  # a tagged span over the cap: as strict
        ("x" * 4097, "cap"),
    ],
)
def test_extract_lenient_gives_no_answer(response: str, problem: str) -> None:
    extraction = extract_lenient(response)
    assert extraction.answer is None
    assert problem in extraction.problem


def test_extract_lenient_caps_the_answer_not_the_completion() -> None:
    assert extract_lenient("y" * 100_000 + "\n" + "x" * 4096).answer == "x" * 4096
    assert extract_lenient("12345", cap=4).answer is None
    assert extract_lenient("reasoning\n" * 1000 + "1234", cap=4).answer == "1234"


def test_extract_lenient_agrees_with_strict_wherever_strict_finds_an_answer() -> None:
    for response in (
        "<answer>x</answer>",
        "a <answer> y </answer> b",
        "<think></think><answer>z</answer>",
    ):
        assert extract_lenient(response) == extract_answer(response)


@pytest.mark.parametrize(
    ("value", "outcome", "reward"),
    [
        (1.0, Outcome.SCORED, 1.0),
        (0, Outcome.SCORED, 0.0),
        (1, Outcome.SCORED, 1.0),
        (True, Outcome.SCORED, 1.0),
        (False, Outcome.SCORED, 0.0),
        (0.25, Outcome.SCORED, 0.25),
        (1.5, Outcome.ENV_ERROR, None),
        (-0.1, Outcome.ENV_ERROR, None),
        (float("nan"), Outcome.ENV_ERROR, None),
        ("1.0", Outcome.ENV_ERROR, None),
        (None, Outcome.ENV_ERROR, None),
    ],
)
def test_grade_value_accepts_numbers_in_unit_interval(
    value: object, outcome: Outcome, reward: float | None
) -> None:
    grade = grade_value(value)
    assert grade.outcome is outcome
    assert grade.reward == reward
    if outcome is Outcome.ENV_ERROR:
        assert grade.detail


class _FloatLike(float):
    """A float subclass: `isinstance` says float, `type` does not."""


def test_grade_value_refuses_an_object_posing_as_a_bool_worth_nan() -> None:
    # Built as an environment would build it past L1 (no dunder in its source): a class whose
    # `__class__` says bool, so `isinstance(x, bool)` is True, and whose float is NaN.
    dunder = "_" * 2
    impostor = type(
        "Impostor",
        (),
        {
            f"{dunder}class{dunder}": property(lambda self: bool),
            f"{dunder}float{dunder}": lambda self: float("nan"),
        },
    )()
    assert isinstance(impostor, bool)
    grade = grade_value(impostor)
    assert (grade.outcome, grade.reward) == (Outcome.ENV_ERROR, None)
    assert "type Impostor" in grade.detail


def test_grade_value_refuses_a_float_subclass_and_bounds_what_it_prints() -> None:
    assert grade_value(_FloatLike(0.5)).outcome is Outcome.ENV_ERROR
    huge = grade_value(10**5000)  # printing it would raise (Python's digit limit)
    assert huge.outcome is Outcome.ENV_ERROR and len(huge.detail) < 100


def test_seed_ranges_are_disjoint() -> None:
    assert TRAIN_SEEDS.stop <= EVAL_SEEDS.start


def test_make_rng_names_an_instance_by_its_triple() -> None:
    draws = [make_rng("env", 3, 5).random() for _ in range(2)]
    assert draws[0] == draws[1]
    assert make_rng("env", 3, 5).random() == random.Random("env:3:5").random()
    assert make_rng("env", 3, 6).random() != draws[0]
    assert make_rng("other", 3, 5).random() != draws[0]


def test_prompt_ends_with_the_answer_instruction() -> None:
    prompt = build_prompt("What is 2+2?\n\n")
    assert prompt.startswith("What is 2+2?\n\n")
    assert prompt.endswith(ANSWER_INSTRUCTION)
    assert "<answer>" in ANSWER_INSTRUCTION and "</answer>" in ANSWER_INSTRUCTION


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"a": [1, 2.5, "x", None, True]}, True),
        ({"a": (1, 2)}, False),
        ({1: "a"}, False),
        ({"a": {1, 2}}, False),
        ({"a": float("nan")}, False),
        ([1, [2, [3]]], True),
        ({"a": 1.0}, True),
    ],
)
def test_json_round_trips(value: object, ok: bool) -> None:
    assert json_round_trips(value) is ok


def test_default_answer_text() -> None:
    assert default_answer_text(7) == "7"
    assert default_answer_text([1, 2, 3]) == "1, 2, 3"
    assert default_answer_text(("a", "b")) == "a, b"
    assert Environment().answer_text([4]) == "4"
