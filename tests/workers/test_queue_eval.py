"""`evoenv eval` (held-out) through real workers and a stand-in model server: each
environment's pass rates (strict and lenient) and intervals beside its best constant answer, in
the table and in `--json` (one object per environment under `environments`).

The stand-in answers every prompt with the same text, so the policy is itself a constant: on
the equality environment (parity, whose scorer ignores case) it passes exactly the even
instances, and the best constant is the more frequent of "even" and "odd"; on the feasibility
environment (at_least) it passes nothing, and the largest reference satisfies every instance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model.fake_vllm import FakeServer
from workerkit import Cluster, run_cli

from evoenv_learner.held_out import wilson
from shared import keys
from shared.environment import EVAL_SEEDS

pytestmark = pytest.mark.integration

SEEDS_DIR = Path(__file__).resolve().parent / "eval_seeds"
ANSWER = "EVEN"
"""What the stand-in policy answers to every prompt."""
N = 6
"""Instances per environment."""


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.routes[("POST", "/v1/chat/completions/render")] = (404, {"detail": "Not Found"})
    choice = {
        "index": 0,
        "message": {"content": f"<answer>{ANSWER}</answer>"},
        "token_ids": [7, 8],
        "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
        "finish_reason": "stop",
    }
    fake.routes[("POST", "/v1/chat/completions")] = (
        200,
        {"choices": [choice], "prompt_token_ids": [1, 2, 3]},
    )
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any, server: FakeServer) -> Cluster:
    cluster: Cluster = cluster_factory(EVOENV_VLLM_URLS=server.url, EVOENV_SEEDS_DIR=str(SEEDS_DIR))
    cluster.start_worker([keys.GRADING_QUEUE, keys.GENERATION_QUEUE], concurrency=2)
    return cluster


def evoenv_eval(cluster: Cluster, *args: str) -> str:
    done = run_cli("eval", "-n", str(N), "-d", "1", *args, env=cluster.worker_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_json_has_one_object_per_environment_with_its_interval_and_best_constant(
    cluster: Cluster,
) -> None:
    result = json.loads(evoenv_eval(cluster, "--json"))
    assert result["instances"] == 2 * N and 0 <= result["ci_low"] <= result["ci_high"] <= 1
    envs = result["environments"]
    assert list(envs) == ["at_least", "parity"]
    assert not any(k.startswith(("best_constant", "records")) for k in result)
    for name, env in envs.items():
        assert env["instances"] == N
        assert env["pass_rate"] == result[f"pass_rate_{name}"]
        assert (env["ci_low"], env["ci_high"]) == wilson(env["pass_rate"], N)
        assert env["ci_low"] <= env["pass_rate"] <= env["ci_high"]

    parity = envs["parity"]["records"]
    assert [r["seed"] for r in parity] == [EVAL_SEEDS.start + k for k in range(N)]
    references = [r["reference"] for r in parity]
    assert set(references) <= {"even", "odd"}
    modal = min(set(references), key=lambda text: (-references.count(text), text))
    assert envs["parity"]["best_constant"] == {
        "answer": modal,
        "score": references.count(modal) / N,
    }
    for record in parity:
        assert record["answer"] == ANSWER
        assert record["reward"] == float(record["reference"] == "even")
        assert record["constant_reward"] == float(record["reference"] == modal)
    assert result["pass_rate_parity"] == references.count("even") / N

    at_least = envs["at_least"]["records"]
    largest = max((r["reference"] for r in at_least), key=int)
    assert envs["at_least"]["best_constant"] == {"answer": largest, "score": 1.0}
    assert [(r["reward"], r["constant_reward"]) for r in at_least] == [(0.0, 1.0)] * N
    assert result["pass_rate_at_least"] == 0.0


def test_the_table_shows_each_interval_and_the_best_constant_beside_the_pass_rates(
    cluster: Cluster,
) -> None:
    table = evoenv_eval(cluster)
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if "│" in line}
    assert "lenient pass rate" in table and "constant (score)" in table
    nothing = f"0.00 [0.00, {wilson(0.0, N)[1]:.2f}]"
    assert rows["at_least"].count(nothing) == 2  # strict and lenient: every answer tagged
    assert "(1.00)" in rows["at_least"] and '"' in rows["at_least"]
    assert '"even"' in rows["parity"] or '"odd"' in rows["parity"]
    interval = r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]"
    assert re.search(rf"{interval}\s+│ {interval}", rows["parity"])
    assert re.search(rf"{interval}\s+│ {interval}", rows["all"])


def test_json_has_the_lenient_rate_of_answers_without_tags_scored_by_the_environment(
    cluster: Cluster, server: FakeServer
) -> None:
    route = ("POST", "/v1/chat/completions")
    tagged = server.routes[route]
    status, body = tagged
    choice = {**body["choices"][0], "message": {"content": f"It is {ANSWER}.\n"}}
    server.routes[route] = (status, {**body, "choices": [choice]})
    try:
        result = json.loads(evoenv_eval(cluster, "--json", "-e", "parity"))
    finally:
        server.routes[route] = tagged
    parity = result["environments"]["parity"]
    records = parity["records"]
    evens = sum(r["reference"] == "even" for r in records)
    assert [(r["answer"], r["reward"]) for r in records] == [(None, 0.0)] * N  # no tags
    assert [r["lenient_answer"] for r in records] == [ANSWER] * N
    assert [r["lenient_reward"] for r in records] == [
        float(r["reference"] == "even") for r in records
    ]
    assert (parity["pass_rate"], parity["lenient_pass_rate"]) == (0.0, evens / N)
    assert (parity["lenient_ci_low"], parity["lenient_ci_high"]) == wilson(evens / N, N)
    assert (result["lenient_pass_rate"], result["pass_rate"]) == (evens / N, 0.0)
    assert (result["lenient_ci_low"], result["lenient_ci_high"]) == wilson(evens / N, N)
    assert parity["best_constant"]["score"] == max(evens, N - evens) / N  # beside them
