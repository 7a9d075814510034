"""The held-out evaluation's result without workers: `evaluate` on stand-in chains and
`constant_baseline` jobs, and the table `evoenv eval` prints from it. The real path (workers,
sandbox, a stand-in model server) is tests/workers/test_queue_eval.py."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from evoenv_cli.terminal_text import print_table
from evoenv_cli.training import _held_out_table
from evoenv_learner import jobs
from evoenv_learner.held_out import (
    constant_rate,
    counted,
    evaluate,
    per_environment,
    summarise,
    wilson,
)
from evoenv_learner.pool import PoolEntry
from shared.environment import EVAL_SEEDS
from shared.messages import ConstantBaseline

N = 4
PASSED = {"parity": [1.0, 0.0, 1.0, 1.0], "at_least": [0.0, 0.5, None, 0.0]}
"""Per environment, the policy's reward on each held-out instance (None: no reward, uncounted)."""
LENIENT = {"parity": [1.0, 1.0, 1.0, 1.0], "at_least": [1.0, 0.5, None, 0.0]}
"""The reward of each one's answer taken leniently (the strict one where there was one)."""
KEYS = {"pass_rate", "instances", "ci_low", "ci_high"}
LENIENT_KEYS = {"lenient_pass_rate", "lenient_ci_low", "lenient_ci_high"}


class Done:
    """An ended AsyncResult."""

    def __init__(self, result: Any, ok: bool = True) -> None:
        self.result, self.ok = result, ok

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return self.ok


class Chains:
    """The orchestrator as `evaluate` uses it: each chain ends with the reward in `PASSED`."""

    def solver_job(self, entry: PoolEntry, **job: Any) -> Any:
        return SimpleNamespace(env=entry.name, **job)

    def send_chain(self, job: Any) -> Done:
        assert job.lenient
        k = job.seed - EVAL_SEEDS.start
        return Done(
            {
                "rewards": [PASSED[job.env][k]],
                "answers": ["EVEN"],
                "lenient_rewards": [LENIENT[job.env][k]],
                "lenient_answers": ["even"],
            }
        )


def entry(name: str) -> PoolEntry:
    return PoolEntry(sha=name * 4, name=name, source="", origin="seed", difficulty=1)


def run(baseline: bool) -> dict[str, Any]:
    settings = SimpleNamespace(
        run="r", learner=SimpleNamespace(environments=[], eval_instances=N, eval_difficulty=1)
    )
    members = [entry("parity"), entry("at_least")]
    return asyncio.run(
        evaluate(settings, Chains(), asyncio.Event(), members, 1, N, baseline)  # type: ignore[arg-type]
    )


@pytest.fixture
def constant_jobs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The `constant_baseline` jobs sent: parity's finds "even" (3 of 4), at_least's fails."""
    sent: list[dict[str, Any]] = []

    def send(name: str, *args: dict[str, Any]) -> Done:
        assert name == "evoenv.constant_baseline"
        (job,) = args
        sent.append(job)
        if job["env"]["name"] == "at_least":
            return Done(None, ok=False)
        found = ConstantBaseline(
            oracle="equality",
            references=["even", "odd", "even", "even"],
            answer="even",
            score=0.75,
            rewards=[1.0, 0.0, 1.0, 1.0],
        )
        return Done(found.model_dump(mode="json"))

    monkeypatch.setattr(jobs, "send", send)
    return sent


def test_without_baseline_each_environment_has_its_rate_and_interval_only() -> None:
    result = run(baseline=False)
    assert {k: result[k] for k in ("pass_rate", "instances")} == {
        "pass_rate": 3 / 7,
        "instances": 7,
    }
    assert (result["ci_low"], result["ci_high"]) == wilson(3 / 7, 7)
    assert result["lenient_pass_rate"] == 5 / 7
    assert (result["lenient_ci_low"], result["lenient_ci_high"]) == wilson(5 / 7, 7)
    assert result["pass_rate_parity"] == 0.75 and result["pass_rate_at_least"] == 0.0
    assert result["environments"] == {
        "at_least": {
            "pass_rate": 0.0,
            "instances": 3,
            **interval(0.0, 3),
            **lenient_interval(1 / 3, 3),
        },
        "parity": {
            "pass_rate": 0.75,
            "instances": 4,
            **interval(0.75, 4),
            **lenient_interval(1, 4),
        },
    }


def test_with_baseline_each_environment_has_its_best_constant_and_records(
    constant_jobs: list[dict[str, Any]],
) -> None:
    result = run(baseline=True)
    assert result == {**run(baseline=False), "environments": result["environments"]}
    assert not any(k.startswith(("best_constant", "records")) for k in result)
    parity, at_least = result["environments"]["parity"], result["environments"]["at_least"]
    assert parity["pass_rate"] == 0.75 and parity["instances"] == 4
    assert parity["best_constant"] == {"answer": "even", "score": 0.75}
    assert set(parity) == set(at_least) == KEYS | LENIENT_KEYS | {"best_constant", "records"}
    assert [
        (r["seed"] - EVAL_SEEDS.start, r["reward"], r["reference"], r["constant_reward"])
        for r in parity["records"]
    ] == [(0, 1.0, "even", 1.0), (1, 0.0, "odd", 0.0), (2, 1.0, "even", 1.0), (3, 1.0, "even", 1.0)]
    assert [(r["lenient_reward"], r["lenient_answer"]) for r in parity["records"]] == [
        (1.0, "even")
    ] * 4
    assert at_least["best_constant"] is None
    assert [r["seed"] - EVAL_SEEDS.start for r in at_least["records"]] == [0, 1, 3]
    assert all(r["reference"] is None and r["constant_reward"] is None for r in at_least["records"])
    assert {job["env"]["name"]: job["seeds"] for job in constant_jobs} == {
        "parity": [EVAL_SEEDS.start + k for k in range(4)],
        "at_least": [EVAL_SEEDS.start + k for k in (0, 1, 3)],
    }


def interval(rate: float, n: int) -> dict[str, float]:
    low, high = wilson(rate, n)
    return {"ci_low": low, "ci_high": high}


def lenient_interval(rate: float, n: int) -> dict[str, float]:
    low, high = wilson(rate, n)
    return {"lenient_pass_rate": rate, "lenient_ci_low": low, "lenient_ci_high": high}


def test_a_worker_without_lenient_rewards_gives_the_strict_ones() -> None:
    jobs = [(entry("parity"), SimpleNamespace(seed=EVAL_SEEDS.start + k)) for k in range(2)]
    graded = [{"rewards": [1.0], "answers": ["even"]}, {"rewards": [0.0], "answers": [None]}]
    records = counted(jobs, graded)["parity"]  # type: ignore[arg-type]
    assert [(r["lenient_reward"], r["lenient_answer"]) for r in records] == [
        (1.0, "even"),
        (0.0, None),
    ]


def test_per_environment_gives_each_its_own_wilson_interval() -> None:
    found = per_environment({"b": [1.0, 1.0], "a": [0.0, 1.0, 0.0]})
    assert list(found) == ["a", "b"]
    assert found["a"] == {"pass_rate": 1 / 3, "instances": 3, **interval(1 / 3, 3)}
    assert found["b"] == {"pass_rate": 1.0, "instances": 2, **interval(1.0, 2)}
    assert found["b"]["ci_low"] < 1.0 == found["b"]["ci_high"]


def table(result: dict[str, Any], width: int = 100) -> dict[str, str]:
    """The rendered table's rows by their first cell, printed as `evoenv eval` prints it on a
    terminal of `width` columns."""
    console = Console(width=width, record=True)
    print_table(console, _held_out_table(result))
    text = console.export_text()
    return {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}


def shown(rate: float, n: int) -> str:
    low, high = wilson(rate, n)
    return f"{rate:.2f} [{low:.2f}, {high:.2f}]"


def test_the_table_shows_each_environments_intervals_then_its_best_constant() -> None:
    passes = {"parity": [1.0, 0.0, 1.0, 1.0], "at_least": [0.0, 0.0]}
    lenient = {"parity": [1.0, 1.0, 1.0, 1.0], "at_least": [1.0, 0.0]}
    result = summarise(passes, lenient) | {"environments": per_environment(passes, lenient)}
    result["environments"]["parity"]["best_constant"] = {"answer": "even", "score": 0.75}
    result["environments"]["at_least"]["best_constant"] = None
    rows = table(result)
    strict, loose = re.escape(shown(0.75, 4)), re.escape(shown(1.0, 4))
    assert re.search(rf'{strict}\s+│ {loose}\s+│ "even" \(0\.75\)', rows["parity"])
    strict, loose = re.escape(shown(0.0, 2)), re.escape(shown(0.5, 2))
    assert re.search(rf"{strict}\s+│ {loose}\s+│ -\s+│", rows["at_least"])
    assert re.search(rf"{re.escape(shown(3 / 6, 6))}\s+│ {re.escape(shown(5 / 6, 6))}", rows["all"])


def test_without_baseline_the_table_shows_dashes_and_a_narrow_one_keeps_the_intervals() -> None:
    passes = {"an_environment_with_a_long_name": [1.0, 0.0, 1.0]}
    lenient = {"an_environment_with_a_long_name": [1.0, 1.0, 1.0]}
    result = summarise(passes, lenient) | {"environments": per_environment(passes, lenient)}
    rows = table(result, width=60)
    (row,) = (line for name, line in rows.items() if name != "all")
    assert shown(2 / 3, 3) in row and shown(1.0, 3) in row and re.search(r"│ -\s+│$", row)


def test_a_result_without_lenient_rates_shows_a_dash_for_them() -> None:
    passes = {"parity": [1.0, 0.0]}
    rows = table(summarise(passes) | {"environments": per_environment(passes)})
    assert re.search(rf"{re.escape(shown(0.5, 2))}\s+│ -\s+│", rows["parity"])


def test_the_constants_pass_rate_is_over_every_instance_and_needs_every_constant(
    constant_jobs: list[dict[str, Any]],
) -> None:
    environments = {
        "parity": {"instances": 4, "best_constant": {"answer": "even", "score": 0.75}},
        "at_least": {"instances": 12, "best_constant": {"answer": "no", "score": 0.25}},
    }
    assert constant_rate(environments) == pytest.approx((3 + 3) / 16)
    assert run(baseline=True).get("constant_pass_rate") is None  # at_least's job failed
    environments["at_least"]["best_constant"] = None
    assert constant_rate(environments) is None
