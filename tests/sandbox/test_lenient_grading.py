"""The lenient answers' rewards of an evaluation (`grade.lenient_rewards`): scored by the
environment's own scorer in the sandbox, in a `grade` op of their own after the strict one,
and never changing the strict grades."""

from __future__ import annotations

from typing import Any

import pytest

from evoenv_worker.grade import grade_group, grade_op, lenient_rewards
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.messages import CompletionRecord, EnvRef, SolverJob

SOURCE = """
import random

from shared.environment import Environment


class Parity(Environment):
    name = "parity"
    description = "Say whether a number is even or odd."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        if difficulty == 9:
            raise RuntimeError("no instance at difficulty 9")
        return {"n": rng.randint(0, 10 ** difficulty)}

    def solve(self, instance: dict) -> str:
        return "even" if instance["n"] % 2 == 0 else "odd"

    def render(self, instance: dict) -> str:
        return f"Is {instance['n']} even or odd?"

    def score(self, instance: dict, reference: str, answer: str) -> float:
        if answer == "raise":
            raise ValueError("cannot read " + answer)
        return 1.0 if answer.strip().lower() == reference else 0.0
"""
TEXTS = [
    "<answer>odd</answer>",  # strict: the lenient reward is the strict one, not scored again
    "The number is EVEN.",  # no tags: "EVEN" after the label mark
    "Answer: odd",
    "<think>it is even",  # thinking never ended: no answer
    "raise",  # the scorer fails on it: not a pass
    "",
]


def job(seed: int, difficulty: int = 1) -> SolverJob:
    return SolverJob(
        run="r-eval",
        group_id="g",
        env=EnvRef(name="parity", sha="0" * 64, source=SOURCE),
        seed=seed,
        difficulty=difficulty,
        group_size=len(TEXTS),
        completions=[CompletionRecord(text=text) for text in TEXTS],
        lenient=True,
    )


def even_seed(sandbox: Sandbox) -> int:
    ops = [{"op": "instance", "seed": seed, "difficulty": 1} for seed in range(20)]
    texts = [result.value["answer_text"] for result in sandbox.run(SOURCE, ops)]
    return texts.index("even")


def counting(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    run = sandbox.run

    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return run(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run", count)
    return calls


def test_lenient_answers_are_scored_by_the_environment_after_the_strict_grades(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(pool={"probe_rate": 0.0, "rescore_rate": 0.0})  # the solver's ops only
    seed = even_seed(sandbox)
    calls = counting(sandbox, monkeypatch)
    group = grade_group(sandbox, job(seed), settings)
    strict = [(c.outcome, c.reward) for c in group.completions]
    assert strict == [("scored", 0.0)] + [("format_error", 0.0)] * 5
    assert lenient_rewards(sandbox, job(seed), group, settings) == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert calls == [
        [grade_op(seed, 1, ["odd", None, None, None, None, None])],
        [grade_op(seed, 1, ["EVEN", "odd", "raise"])],  # the scorer raises on the last one
    ]
    assert [(c.outcome, c.reward) for c in group.completions] == strict


def test_nothing_is_scored_again_without_a_lenient_answer_or_an_instance(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(pool={"probe_rate": 0.0, "rescore_rate": 0.0})  # the solver's ops only
    failed = grade_group(sandbox, job(0, difficulty=9), settings)
    tagged = job(0).model_copy(
        update={"completions": [CompletionRecord(text="<answer>even</answer>")]}
    )
    calls = counting(sandbox, monkeypatch)
    assert lenient_rewards(sandbox, job(0, 9), failed, settings) == [None] * len(TEXTS)
    graded = grade_group(sandbox, tagged, settings)
    assert lenient_rewards(sandbox, tagged, graded, settings) == [graded.completions[0].reward]
    assert len(calls) == 1  # the strict op alone
