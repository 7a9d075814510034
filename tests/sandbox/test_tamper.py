"""An environment that changes what the runner relies on in its child (`runner.Framework`):
detected after loading and after each op, and the request's results say so."""

from __future__ import annotations

import pytest

from evoenv_worker.grade import grade_group
from evoenv_worker.sandbox import runner
from evoenv_worker.sandbox.host import Sandbox
from shared.config import SandboxSettings, Settings
from shared.messages import CompletionRecord, EnvRef, SolverGroupData, SolverJob

TEMPLATE = """
import random
import typing

from shared.environment import Environment

LOAD


class Tamperer(Environment):
    name = "tamperer"
    description = "Repeat a number."

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(1, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        SCORE
        return 1.0 if answer.strip() == str(reference) else 0.0
"""
AT_LOAD = {
    # through module attributes: typing imports sys
    "grade_value": 'typing.sys.modules["shared.environment"].grade_value = lambda v: None',
    "runner": 'typing.sys.modules["__main__"].run_op = lambda *a: {"ok": True, "value": 1.0}',
    "builtins": 'typing.sys.modules["builtins"].float = lambda *a: 1.0',
    "json": 'typing.sys.modules["json"].dumps = lambda *a, **k: "{}"',
    "added": 'typing.sys.modules["shared.environment"].extra = 1',
    "module": 'typing.sys.modules["shared.environment"] = typing',
}
INSTANCE = {"op": "instance", "seed": 1, "difficulty": 1}


def source(load: str = "", score: str = "pass") -> str:
    return TEMPLATE.replace("LOAD", load).replace("SCORE", score)


@pytest.mark.parametrize("attack", sorted(AT_LOAD))
def test_a_framework_modified_at_load_fails_every_op(sandbox: Sandbox, attack: str) -> None:
    results = sandbox.run(source(AT_LOAD[attack]), [{"op": "describe"}, INSTANCE])
    for result in results:
        assert (result.ok, result.kind) == (False, "tamper"), result
        assert result.error.startswith(runner.TAMPERED), result.error
    assert "shared.environment" in results[0].error or attack in {"runner", "builtins", "json"}


def test_a_framework_modified_by_a_routine_fails_that_op_and_the_rest(sandbox: Sandbox) -> None:
    patch = 'typing.sys.modules["shared.environment"].grade_value = lambda v: "forged"'
    tamper = source(score=patch)
    made, scored, again = sandbox.run(
        tamper,
        [INSTANCE, {"op": "score", "from": 0, "answer": "7"}, INSTANCE],
    )
    assert made.ok, made
    assert (scored.ok, scored.kind, scored.routine) == (False, "tamper", ""), scored
    assert "shared.environment.grade_value was replaced" in scored.error
    assert (again.ok, again.kind) == (False, "tamper"), again


def test_an_unchanged_framework_is_not_reported(sandbox: Sandbox) -> None:
    benign = source(load="import fractions  # a first import changes no guarded module")
    made, scored = sandbox.run(benign, [INSTANCE, {"op": "score", "from": 0, "answer": None}])
    assert made.ok and scored.ok and scored.value == 1.0, (made, scored)


def test_a_group_graded_by_a_tampering_scorer_is_an_env_error(
    sandbox: Sandbox, confined_settings: SandboxSettings
) -> None:
    patch = 'typing.sys.modules["shared.environment"].grade_value = lambda v: "forged"'
    texts = ["<answer>1</answer>", "<answer>2</answer>", "no answer"]
    job = SolverJob(
        run="test",
        group_id="group",
        env=EnvRef(name="tamperer", sha="0" * 64, source=source(score=patch)),
        seed=1,
        difficulty=1,
        group_size=len(texts),
        prompt="(prompt)",
        completions=[CompletionRecord(text=text) for text in texts],
    )
    group = grade_group(sandbox, job, Settings(sandbox=confined_settings))
    assert [(c.outcome, c.reward) for c in group.completions] == [("env_error", None)] * 3
    assert isinstance(group.data, SolverGroupData)
    assert runner.TAMPERED in str(group.data.env_error)
