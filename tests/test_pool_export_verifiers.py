"""`evoenv pool export --format verifiers`: the package, installed by pip beside each pinned
verifiers in its own folder, loads through that version's own loader (0.3.1's legacy
`load_environment`, 0.4.0's taskset), its rows keep to their splits, and the reward, the
environment's own scorer, gives the references 1.0; importing the package needs no verifiers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import pip_install_target, run_isolated, sandbox_or_missing
from test_pool_export import environment_of, evoenv, make_archive
from verifiers_support import LEGACY, V1, client_env, result, start

from shared.environment import ANSWER_INSTRUCTION, EVAL_SEEDS, TRAIN_SEEDS
from shared.errors import UsageError

INFO_KEYS = {"environment", "sha", "seed", "difficulty", "split", "instance", "reference"}
SIZE = 12
"""Rows of each split: every seed environment once, two of them twice."""

LEGACY_CLIENT = """
import asyncio, json, sys
import verifiers as vf

size = int(sys.argv[1])


def rows(dataset):
    return [{"prompt": r["prompt"], "answer": r["answer"], "info": r["info"]} for r in dataset]


async def reward(env, row, reply):
    # the rubric scores a rollout's state as the environment's own rollouts leave it
    state = {
        "prompt": row["prompt"],
        "completion": [{"role": "assistant", "content": reply}],
        "answer": row["answer"],
        "info": row["info"],
        "trajectory": [],
        "input": row,
    }
    await env.rubric.score_rollout(state)
    return state["metrics"]["evoenv_score"]


def rewards(env, rows, reply):
    return [asyncio.run(reward(env, row, reply(row))) for row in rows]


env = vf.load_environment(
    "evoenv-pool", num_train_examples=size, num_eval_examples=size, difficulty=1
)
train, held_out = rows(env.get_dataset()), rows(env.get_eval_dataset())
trusted = vf.load_environment(
    "evoenv-pool", environment="sort_words", num_eval_examples=2, in_process=True
)
local = rows(trusted.get_eval_dataset())
print(json.dumps({
    "type": type(env).__name__,
    "single_turn": isinstance(env, vf.SingleTurnEnv),
    "train": train,
    "eval": held_out,
    "references": rewards(env, train + held_out, lambda r: f"<answer>{r['answer']}</answer>"),
    "thinking": rewards(env, held_out, lambda r: f"<think>x</think> <answer> {r['answer']} </answer>"),
    "wrong": rewards(env, held_out, lambda r: "<answer>surely not this</answer>"),
    "no_answer": rewards(env, held_out, lambda r: r["answer"]),
    "local": local,
    "local_references": rewards(trusted, local, lambda r: f"<answer>{r['answer']}</answer>"),
}))
"""

V1_CLIENT = """
import asyncio, json, sys
import verifiers.v1 as vf
from verifiers.v1.state import state_cls
from verifiers.v1.trace import Trace, TraceTask

size = int(sys.argv[1])


def taskset(**options):
    config = vf.taskset_config_type("evoenv-pool")(id="evoenv-pool", **options)
    return vf.load_taskset(config)


async def reward(task, reply):
    # a trace as validate builds one, its root agent's reply given
    trace = Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=vf.AgentInfo(
            config=vf.AgentConfig(runtime=vf.SubprocessConfig()), name="test", trainable=False
        ),
    )
    trace.root_reply = reply
    await task.score(trace)
    return trace.rewards["evoenv_score"].score


def rewards(tasks, reply):
    return [asyncio.run(reward(task, reply(task))) for task in tasks]


def rows(tasks):
    return [
        {"prompt": [{"role": "user", "content": t.data.prompt}], "answer": t.data.answer,
         "info": t.data.info, "id": t.data.id, "name": t.data.name}
        for t in tasks
    ]


train = taskset(size=size, difficulty=1)
held_out = taskset(size=size, difficulty=1, split="eval")
train_tasks, eval_tasks = list(train), list(held_out)
print(json.dumps({
    "type": type(train).__name__,
    "train": rows(train_tasks),
    "eval": rows(eval_tasks),
    "references": rewards(train_tasks + eval_tasks, lambda t: f"<answer>{t.data.answer}</answer>"),
    "wrong": rewards(eval_tasks, lambda t: "<answer>surely not this</answer>"),
    "no_answer": rewards(eval_tasks, lambda t: t.data.answer),
    "gold": [asyncio.run(t.validate(None)) for t in eval_tasks],
}))
"""

WITHOUT_VERIFIERS = """
import json, sys
sys.path.insert(0, SITE)
import evoenv_pool
found = {}
for name in ("EvoEnvPoolTaskset", "load_environment"):
    try:
        getattr(evoenv_pool, name)()
    except ModuleNotFoundError as exc:
        found[name] = exc.name
print(json.dumps({
    "all": evoenv_pool.__all__,
    "missing": found,
    "rows": len(evoenv_pool.create_dataset("all", size=3, in_process=True)),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "verifiers"),
}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The seeds exported with `--format verifiers` (the folder) and installed by pip (site)."""
    sandbox_or_missing()
    root = tmp_path_factory.mktemp("verifiers")
    env = environment_of(make_archive(root, admitted=False))
    evoenv(env, "pool", "export", "--format", "verifiers", root / "pool")
    pip_install_target(root / "pool", root / "site")
    return root / "pool", root / "site"


@pytest.fixture(scope="module")
def clients(exported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What each version's client saw, both run at once."""
    _, site = exported
    started = {}
    for version, code in ((LEGACY, LEGACY_CLIENT), (V1, V1_CLIENT)):
        home = tmp_path_factory.mktemp(f"home-{version}")
        started[version] = start(code, client_env(version, site, home), home, str(SIZE))
    return {version: result(proc, timeout=300) for version, proc in started.items()}


def pool_records(folder: Path) -> dict[str, dict[str, Any]]:
    text = (folder / "evoenv_pool" / "pool.json").read_text()
    return {e["name"]: e for e in json.loads(text)["environments"]}


def test_the_export_is_the_reasoning_gym_package_with_verifiers_modules(
    exported: tuple[Path, Path],
) -> None:
    folder, site = exported
    package = site / "evoenv_pool"
    assert {"verifiers_env.py", "verifiers_v1.py", "dataset.py"} <= {
        p.name for p in package.glob("*.py")
    }
    assert "and a verifiers environment" in (folder / "pyproject.toml").read_text()
    assert "## With verifiers" in (folder / "README.md").read_text()
    assert (package / "environments" / "sort_words.py").is_file()


def test_the_package_imports_without_verifiers(exported: tuple[Path, Path], tmp_path: Path) -> None:
    # -I -S: no site-packages (neither verifiers nor the project), no PYTHONPATH
    code = WITHOUT_VERIFIERS.replace("SITE", repr(str(exported[1])))
    done = run_isolated(code, tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert {"EvoEnvPoolTaskset", "load_environment", "create_dataset"} <= set(found["all"])
    assert found["missing"] == {"EvoEnvPoolTaskset": "verifiers", "load_environment": "verifiers"}
    assert found["rows"] == 3 and found["modules"] == []


@pytest.mark.parametrize("version", [LEGACY, V1])
def test_each_version_loads_rows_that_keep_to_their_splits(
    clients: Any, exported: tuple[Path, Path], version: str
) -> None:
    seen = clients[version]
    records = pool_records(exported[0])
    names = sorted(records)
    assert seen["type"] == ("SingleTurnEnv" if version == LEGACY else "EvoEnvPoolTaskset")
    for split, seeds in (("train", TRAIN_SEEDS), ("eval", EVAL_SEEDS)):
        rows = seen[split]
        assert [row["info"]["environment"] for row in rows] == (names * 2)[:SIZE]
        assert [row["info"]["seed"] for row in rows] == [seeds.start + i for i in range(SIZE)]
        for row in rows:
            info = row["info"]
            assert set(info) == INFO_KEYS | {"in_process"} and info["in_process"] is False
            assert (info["split"], info["difficulty"]) == (split, 1)
            assert info["sha"] == records[info["environment"]]["sha"]
            assert row["answer"] and isinstance(row["answer"], str)
            for key in ("instance", "reference"):
                json.loads(info[key])  # JSON text: one Arrow column holds every environment's
            (message,) = row["prompt"]
            assert message["role"] == "user" and message["content"].endswith(ANSWER_INSTRUCTION)
    train_seeds = {row["info"]["seed"] for row in seen["train"]}
    assert max(train_seeds) < EVAL_SEEDS.start <= min(r["info"]["seed"] for r in seen["eval"])


def test_both_versions_get_the_same_rows_from_the_one_sampler(clients: Any) -> None:
    legacy, v1 = clients[LEGACY], clients[V1]
    for split in ("train", "eval"):
        keep = ("prompt", "answer", "info")
        assert [{k: r[k] for k in keep} for r in v1[split]] == legacy[split]
    task = v1["eval"][0]
    info = task["info"]
    assert task["id"] == f"{info['environment']}/eval/{info['seed']}/1"
    assert task["name"] == info["environment"]


@pytest.mark.parametrize("version", [LEGACY, V1])
def test_the_reward_is_the_environments_own_scorer(clients: Any, version: str) -> None:
    seen = clients[version]
    assert seen["references"] == [1.0] * (2 * SIZE)
    assert all(0.0 <= r < 1.0 for r in seen["wrong"]) and len(seen["wrong"]) == SIZE
    assert seen["no_answer"] == [0.0] * SIZE  # the bare answer has no <answer> span
    if version == LEGACY:
        assert seen["single_turn"] and seen["thinking"] == [1.0] * SIZE
    else:
        assert seen["gold"] == [True] * SIZE  # `Task.validate`, vf-validate's gold check


def test_the_in_process_opt_in_follows_the_rows(clients: Any) -> None:
    legacy = clients[LEGACY]
    assert [row["info"]["in_process"] for row in legacy["local"]] == [True, True]
    assert [row["info"]["seed"] for row in legacy["local"]] == [
        EVAL_SEEDS.start + i for i in (0, 1)
    ]
    assert legacy["local_references"] == [1.0, 1.0]


def test_verifiers_takes_one_difficulty(tmp_path: Path) -> None:
    env = environment_of(make_archive(tmp_path, admitted=False))
    error = evoenv(env, "pool", "export", "--format", "verifiers", "-d", "1-2", tmp_path / "out")
    assert isinstance(error, UsageError)
    assert str(error).startswith("--format verifiers takes one --difficulty")


def test_a_client_cannot_look_up_or_reach_beyond_loopback(tmp_path: Path) -> None:
    # The hook raises before the lookup: no query leaves the machine.
    code = "import socket\nsocket.getaddrinfo('example.invalid', 443)"
    proc = start(code, {"PATH": "/usr/bin:/bin"}, tmp_path)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "a name lookup of 'example.invalid'" in stderr
