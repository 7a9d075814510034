"""A real client of `evoenv pool export --format verifiers`: the cluster's pool, exported and
installed by pip beside each pinned verifiers, is evaluated by that version's own entry point
against the cluster's vLLM server, two rows of each of two environments: 0.3.1's `vf-eval` (the
legacy CLI) and 0.4.0's `vf-eval` (its null harness, a chat program, in a subprocess runtime).
Every row gets a reward in [0, 1], and the references score 1.0 (0.4.0: `vf-validate`)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Cluster, evoenv
from support import pip_install_target
from verifiers_support import LEGACY, V1, client_env, result, start

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ENVIRONMENTS = ("count_connected_components", "sort_words")
ROWS = 2
"""Rows of each environment: its first evaluation seeds, at difficulty 1."""
MAX_TOKENS = 64
KEY = "VERIFIERS_TEST_API_KEY"
"""The variable the clients read the API key from (vLLM takes any)."""

LEGACY_EVAL = """
import asyncio, glob, json, sys
import verifiers as vf
from verifiers.legacy.scripts.eval import main

url, model, out, key, rows, max_tokens, *environments = sys.argv[1:]
evaluated, references = [], []
for name in environments:
    options = {"environment": name, "num_train_examples": 1, "num_eval_examples": int(rows),
               "difficulty": 1}
    main(["evoenv-pool", "-m", model, "-b", url, "-k", key, "-n", rows, "-r", "1",
          "-t", max_tokens, "-s", "-o", f"{out}/{name}", "-d", "--disable-env-server",
          "-a", json.dumps(options)])
    (saved,) = glob.glob(f"{out}/{name}/evals/*/*/results.jsonl")
    with open(saved) as file:
        evaluated += [json.loads(line) for line in file]
    # the references, scored by the environment's rubric as the rollouts were
    env = vf.load_environment("evoenv-pool", **options)
    for row in env.get_eval_dataset():
        state = {"prompt": row["prompt"], "answer": row["answer"], "info": row["info"],
                 "completion": [{"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}],
                 "trajectory": [], "input": row}
        asyncio.run(env.rubric.score_rollout(state))
        references.append(state["metrics"]["evoenv_score"])
print(json.dumps({
    "rows": [
        {"reward": r["reward"], "score": r["metrics"]["evoenv_score"], "info": r["info"],
         "error": r["error"], "completion": r["completion"]}
        for r in evaluated
    ],
    "references": references,
}))
"""

V1_EVAL = """
import glob, json, sys
from verifiers.v1.cli.eval.main import main as evaluate
from verifiers.v1.cli.validate import main as validate

url, model, out, key, rows, max_tokens, *environments = sys.argv[1:]
traces, gold = [], []
for name in environments:
    taskset = ["--env.taskset.environment", name, "--env.taskset.size", rows,
               "--env.taskset.difficulty", "1", "--env.taskset.split", "eval"]
    evaluate(["evoenv-pool", "-m", model, "--client.base-url", url, "--client.api-key-var", key,
              "--sampling.max-tokens", max_tokens, "-n", rows, "-r", "1", "--no-push",
              "--no-rich", "-o", f"{out}/eval-{name}", "--env.agent.harness.id", "null",
              "--env.agent.runtime.type", "subprocess", *taskset])
    (saved,) = glob.glob(f"{out}/eval-{name}/*/traces.jsonl")
    with open(saved) as file:
        traces += [json.loads(line) for line in file]
    # the references: vf-validate's gold check, `Task.validate`
    validate(["evoenv-pool", "--only-gold", "-n", rows, "--runtime.type", "subprocess",
              "--no-rich", "-o", f"{out}/validate-{name}",
              *[arg.replace("--env.taskset.", "--taskset.") for arg in taskset]])
    (saved,) = glob.glob(f"{out}/validate-{name}/*/results.jsonl")
    with open(saved) as file:
        gold += [json.loads(line) for line in file]
print(json.dumps({
    "rows": [
        {"ok": e["ok"], "errors": e["errors"], "task": e["task"]["data"],
         "rewards": [t["rewards"] for t in e["traces"]],
         "replies": [[n["message"] for n in t["nodes"]] for t in e["traces"]]}
        for e in traces
    ],
    "gold": gold,
}))
"""


def evaluate_both(site: Path, url: str, model: str, folder: Path) -> dict[str, Any]:
    """Each version's client on the installed export at `site`, against the OpenAI-compatible
    server at `url` (its `/v1`), both at once; what each printed."""
    started = {}
    for version, code in ((LEGACY, LEGACY_EVAL), (V1, V1_EVAL)):
        home = folder / f"home-{version}"
        home.mkdir()
        env = client_env(version, site, home, **{KEY: "EMPTY"})
        args = (url, model, str(home / "out"), KEY, str(ROWS), str(MAX_TOKENS), *ENVIRONMENTS)
        started[version] = start(code, env, home, *args)
    return {version: result(proc, timeout=900) for version, proc in started.items()}


def check_legacy(seen: dict[str, Any]) -> None:
    rows = seen["rows"]
    assert len(rows) == ROWS * len(ENVIRONMENTS)
    for row in rows:
        assert row["error"] is None, row
        assert 0.0 <= row["reward"] <= 1.0 and row["reward"] == row["score"], row
        assert row["completion"][-1]["role"] == "assistant", row
    infos = [row["info"] for row in rows]
    assert Counter(i["environment"] for i in infos) == dict.fromkeys(ENVIRONMENTS, ROWS)
    assert {i["split"] for i in infos} == {"eval"} and min(i["seed"] for i in infos) >= 10**9
    assert seen["references"] == [1.0] * (ROWS * len(ENVIRONMENTS))


def check_v1(seen: dict[str, Any]) -> None:
    rows = seen["rows"]
    assert len(rows) == ROWS * len(ENVIRONMENTS)
    for row in rows:
        assert row["ok"] and not row["errors"], row
        ((name, reward),) = row["rewards"][0].items()
        assert name == "evoenv_score" and 0.0 <= reward["score"] <= 1.0, row
        assert any(m["role"] == "assistant" for m in row["replies"][0]), row
    tasks = [row["task"] for row in rows]
    assert Counter(t["name"] for t in tasks) == dict.fromkeys(ENVIRONMENTS, ROWS)
    assert {t["info"]["split"] for t in tasks} == {"eval"}
    gold = seen["gold"]
    assert len(gold) == ROWS * len(ENVIRONMENTS)
    assert all(g["valid"] is True and g["reason"] == "valid" for g in gold), gold


def test_each_verifiers_evaluates_the_pool_against_the_server(
    cluster: Cluster, tmp_path: Path
) -> None:
    exported = subprocess.run(
        evoenv("pool", "export", "--format", "verifiers", str(tmp_path / "pool")),
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    pip_install_target(tmp_path / "pool", tmp_path / "site")
    model = cluster.settings().model
    seen = evaluate_both(tmp_path / "site", f"{cluster.server.url}/v1", model, tmp_path)
    check_legacy(seen[LEGACY])
    check_v1(seen[V1])
