"""The best constant answer found in the sandbox (`grade.constant_baseline`), on the two
environments of the held-out evaluation test: one equality oracle, one feasibility oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evoenv_worker.grade import constant_baseline
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.messages import ConstantJob, EnvRef

SEEDS_DIR = Path(__file__).resolve().parents[1] / "workers" / "eval_seeds"
PARITY = (SEEDS_DIR / "parity.py").read_text()
AT_LEAST = (SEEDS_DIR / "at_least.py").read_text()
SEEDS = list(range(100, 112))


def job(name: str, source: str, answers: list[str], seeds: list[int] = SEEDS) -> ConstantJob:
    env = EnvRef(name=name, sha="0" * 64, source=source)
    return ConstantJob(env=env, seeds=seeds, difficulty=1, answers=answers)


def references(sandbox: Sandbox, source: str, seeds: list[int]) -> list[str]:
    ops = [{"op": "instance", "seed": seed, "difficulty": 1} for seed in seeds]
    return [str(result.value["answer_text"]) for result in sandbox.run(source, ops)]


def counting(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    run = sandbox.run

    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return run(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run", count)
    return calls


def test_equality_the_modal_reference_scored_by_the_environment(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = references(sandbox, PARITY, SEEDS)
    modal = min(set(expected), key=lambda text: (-expected.count(text), text))
    calls = counting(sandbox, monkeypatch)
    found = constant_baseline(sandbox, job("parity", PARITY, ["EVEN"] * 12), Settings())
    assert len(calls) == 2  # references, then every candidate on every instance
    assert [op["answers"] for op in calls[1]] == [[modal]] * len(SEEDS)  # policy answers: no
    assert (found.oracle, found.references, found.answer) == ("equality", expected, modal)
    assert found.rewards == [float(text == modal) for text in expected]
    assert found.score == expected.count(modal) / len(SEEDS)
    assert found.error is None


def test_feasibility_the_candidate_that_satisfies_most_instances_wins(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = references(sandbox, AT_LEAST, SEEDS)
    found = constant_baseline(sandbox, job("at_least", AT_LEAST, []), Settings())
    assert found.oracle == "feasibility"
    assert found.answer == max(expected, key=int)  # the largest reference satisfies them all
    assert (found.score, found.rewards) == (1.0, [1.0] * len(SEEDS))
    calls = counting(sandbox, monkeypatch)
    found = constant_baseline(sandbox, job("at_least", AT_LEAST, ["100"] * 3 + ["x"]), Settings())
    assert found.answer == "100"  # as good, and the most frequent candidate
    assert set(calls[1][0]["answers"]) == {*expected, "100", "x"}


def test_a_failing_scorer_fails_that_candidate_and_a_failing_sample_the_whole_job(
    sandbox: Sandbox,
) -> None:
    raising = AT_LEAST.replace("text.isdigit() and int(text)", "int(text)")
    found = constant_baseline(sandbox, job("at_least", raising, ["x"] * 20), Settings())
    assert found.answer != "x" and found.score == 1.0  # "x" raised: it passed nothing
    broken = AT_LEAST.replace('return {"n"', 'assert False\n        return {"n"')
    failed = constant_baseline(sandbox, job("at_least", broken, []), Settings())
    assert failed.answer is None and failed.error is not None
    assert failed.error.startswith("sample failed")
