"""`evoenv pool export`: the three formats, the selection and difficulty options, the command's
errors, and the exported `evoenv_pool` package (installed with pip into a private folder):
its datasets' shape and determinism, seeds and splits, scoring, the sandbox and in-process
modes, and that it never shadows the project's `shared`."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import pip_install_target, run_isolated, sandbox_or_missing
from typer.testing import CliRunner

import shared
import shared.environment
from evoenv_cli import app
from evoenv_learner.pool import seed_pool
from shared.db import Archive, EnvironmentRow, source_sha
from shared.env_stats import CalibrationFigures, EnvStats
from shared.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
SEEDS_DIR = REPO / "seeds"
SEED_NAMES = sorted(p.stem for p in SEEDS_DIR.glob("*.py"))

FRAGILE = textwrap.dedent(
    """
    import random

    from shared.environment import Environment


    class FragileSum(Environment):
        name = "fragile_sum"
        description = "Add two numbers."
        min_difficulty = 1
        max_difficulty = 5

        def sample(self, rng: random.Random, difficulty: int) -> dict:
            top = 10**difficulty
            return {"a": rng.randint(0, top), "b": rng.randint(0, top)}

        def solve(self, instance: dict) -> int:
            return instance["a"] + instance["b"]

        def render(self, instance: dict) -> str:
            return f"What is {instance['a']} + {instance['b']}? Write the integer."

        def score(self, instance: dict, reference: int, answer: str) -> float:
            if answer == "boom":
                raise ValueError("boom")
            if answer == "big":
                return 7
            if answer == "loop":
                while True:
                    pass
            return float(answer.strip() == str(reference))
    """
)
"""An admitted environment of the test archive (never validated): a scorer that raises, returns
a number out of range or never returns on chosen answers."""
SERVING = 3
"""fragile_sum's serving difficulty in the archive."""


def environment_of(archive_url: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    return {**base, "EVOENV_DATABASE_URL": archive_url}


def make_archive(folder: Path, *, admitted: bool) -> str:
    """An archive with the seeds and, if `admitted`, fragile_sum (a child of sort_words)."""
    url = f"sqlite:///{folder / 'archive.db'}"
    archive = Archive(url)
    seed_pool(archive, SEEDS_DIR)
    if admitted:
        parent = archive.by_name("sort_words")
        assert parent is not None
        stats = EnvStats(
            serving_difficulty=SERVING,
            calibration_difficulty=2,
            calibration=CalibrationFigures(pass_rate=0.5, passes=4, instances=8, difficulty=2),
        )
        row = EnvironmentRow(
            sha=source_sha(FRAGILE),
            name="fragile_sum",
            source=FRAGILE,
            status="admitted",
            origin="generated",
            parents=[parent.sha],
            stats=stats,
        )
        with archive.session() as session:
            session.add(row)
            session.commit()
    archive.engine.dispose()
    return url


def evoenv(env: dict[str, str], *args: str | Path) -> Any:
    """`evoenv ARGS` in this process; the result, or the UsageError it raised."""
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    if isinstance(result.exception, UsageError):
        return result.exception
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture(scope="module")
def sandbox_works() -> None:
    sandbox_or_missing()


@pytest.fixture(scope="module")
def archive_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return environment_of(make_archive(tmp_path_factory.mktemp("archive"), admitted=True))


@pytest.fixture(scope="module")
def site(
    archive_env: dict[str, str], sandbox_works: None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The reasoning-gym export of the test archive, installed by pip into its own folder."""
    folder = tmp_path_factory.mktemp("export") / "pool"
    evoenv(archive_env, "pool", "export", "--format", "reasoning-gym", folder)
    return pip_install_target(folder, folder.parent / "site")


@pytest.fixture(scope="module")
def pool(site: Path) -> Iterator[ModuleType]:
    """`evoenv_pool`, imported from the install folder (and forgotten afterwards)."""
    sys.path.insert(0, str(site))
    try:
        yield importlib.import_module("evoenv_pool")
    finally:
        sys.path.remove(str(site))
        for name in [n for n in sys.modules if n == "evoenv_pool" or n.startswith("evoenv_pool.")]:
            del sys.modules[name]


# ----------------------------------------------------------------------------- the command


def test_files_is_the_default_and_the_selection_options_work(
    archive_env: dict[str, str], tmp_path: Path
) -> None:
    evoenv(archive_env, "pool", "export", tmp_path / "all")
    assert sorted(p.stem for p in (tmp_path / "all").glob("*.py")) == sorted(
        [*SEED_NAMES, "fragile_sum"]
    )
    listed = json.loads((tmp_path / "all" / "pool.json").read_text())
    assert {e["name"]: e["serving_difficulty"] for e in listed}["fragile_sum"] == SERVING

    evoenv(archive_env, "pool", "export", "--seeds-only", tmp_path / "seeds")
    assert sorted(p.stem for p in (tmp_path / "seeds").glob("*.py")) == SEED_NAMES
    evoenv(archive_env, "pool", "export", "--admitted-only", tmp_path / "admitted")
    assert [p.name for p in (tmp_path / "admitted").glob("*.py")] == ["fragile_sum.py"]
    assert (tmp_path / "admitted" / "fragile_sum.py").read_text() == FRAGILE


@pytest.mark.parametrize("name", ["../escaped", "sort_words\n"], ids=["path", "final-newline"])
def test_a_name_that_is_not_snake_case_is_left_out_and_writes_nothing_elsewhere(
    name: str, tmp_path: Path
) -> None:
    url = make_archive(tmp_path, admitted=False)
    archive = Archive(url)
    source = FRAGILE.replace('"fragile_sum"', json.dumps(name))
    row = EnvironmentRow(sha=source_sha(source), name=name, source=source, status="admitted")
    with archive.session() as session:
        session.add(row)
        session.commit()
    archive.engine.dispose()
    result = evoenv(environment_of(url), "pool", "export", tmp_path / "out" / "files")
    assert f"skipped {name!r}" in result.output
    assert sorted(p.stem for p in (tmp_path / "out" / "files").glob("*.py")) == SEED_NAMES
    assert not (tmp_path / "out" / "escaped.py").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--format", "csv"],
            "unknown export format 'csv' (one of: files, reasoning-gym, verifiers, jsonl)",
        ),
        (
            ["--seeds-only", "--admitted-only"],
            "--seeds-only and --admitted-only exclude each other",
        ),
        (["--count", "5"], "--count and --split apply to --format jsonl only"),
        (["--format", "reasoning-gym", "--split", "eval"], "--count and --split apply"),
        (["-d", "3"], "--difficulty applies to --format reasoning-gym, verifiers and jsonl only"),
        (["--format", "jsonl", "-d", "x"], "--difficulty takes a level or a range LO-HI, not 'x'"),
        (["--format", "jsonl", "-d", "5-2"], "--difficulty 5-2: the range is empty"),
        (["--format", "reasoning-gym", "-d", "1-2"], "--format reasoning-gym takes one"),
        (["--format", "jsonl", "--count", "0"], "--count must be at least 1, not 0"),
        (["--format", "jsonl", "--split", "test"], "--split must be train or eval, not 'test'"),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    archive_env: dict[str, str], tmp_path: Path, args: list[str], message: str
) -> None:
    error = evoenv(archive_env, "pool", "export", *args, tmp_path / "out")
    assert isinstance(error, UsageError) and str(error).startswith(message)
    assert not (tmp_path / "out").exists()


def test_a_file_or_an_empty_selection_is_refused_in_one_line_with_exit_2(tmp_path: Path) -> None:
    env = environment_of(make_archive(tmp_path, admitted=False))
    command = [sys.executable, "-c", "from evoenv_cli import main; main()", "pool", "export"]
    (tmp_path / "a_file").write_text("x")
    for args, message in (
        ([tmp_path / "a_file"], f"error: {tmp_path / 'a_file'} is not a folder"),
        (
            ["--admitted-only", tmp_path / "out"],
            "error: the pool has no environment of status admitted to export",
        ),
    ):
        done = subprocess.run(
            [*command, *map(str, args)], env=env, capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stderr.strip()) == (2, message)


def test_jsonl_loads_with_datasets_and_keeps_to_its_split(
    archive_env: dict[str, str], sandbox_works: None, tmp_path: Path
) -> None:
    args = ["pool", "export", "--format", "jsonl", "--admitted-only", "-n", "4", "-d", "1"]
    evoenv(archive_env, *args, "-d", "2-3", "-d", "9", tmp_path / "out")
    lines = [
        json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    ]
    assert len(lines) == 4 * 4  # 1, 2, 3 and 9 clamped into the range 1-5
    assert sorted({line["difficulty"] for line in lines}) == [1, 2, 3, 5]
    assert {line["seed"] for line in lines} == {0, 1, 2, 3}
    for line in lines:
        instance, reference = json.loads(line["instance"]), json.loads(line["reference"])
        assert reference == instance["a"] + instance["b"] and line["answer"] == str(reference)
        assert line["prompt"].endswith(shared.environment.ANSWER_INSTRUCTION)
        assert (line["environment"], line["sha"], line["split"]) == (
            "fragile_sum",
            source_sha(FRAGILE),
            "train",
        )
    meta = json.loads((tmp_path / "out" / "pool.json").read_text())
    assert meta["environments"][0]["difficulty"] == SERVING

    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(
        "json", data_files=str(tmp_path / "out" / "train.jsonl"), cache_dir=str(tmp_path / "hf")
    )["train"]
    assert len(loaded) == len(lines) and loaded[0] == lines[0]

    evoenv(archive_env, "pool", "export", "--format", "jsonl", "--split", "eval", "-n", "2",
           tmp_path / "eval")  # fmt: skip
    held_out = [
        json.loads(line) for line in (tmp_path / "eval" / "eval.jsonl").read_text().splitlines()
    ]
    assert len(held_out) == 2 * (len(SEED_NAMES) + 1)
    assert {line["seed"] for line in held_out} == {10**9, 10**9 + 1}
    assert {line["split"] for line in held_out} == {"eval"}


def test_the_package_records_the_pool_and_carries_its_own_base_module(site: Path) -> None:
    package = site / "evoenv_pool"
    assert (package / "environment.py").read_text() == Path(shared.environment.__file__).read_text()
    assert not list(package.glob("verifiers*.py"))  # --format verifiers adds those
    assert sorted(p.stem for p in (package / "environments").glob("*.py")) == sorted(
        [*SEED_NAMES, "fragile_sum"]
    )
    records = {
        e["name"]: e for e in json.loads((package / "pool.json").read_text())["environments"]
    }
    fragile = records["fragile_sum"]
    assert fragile["sha"] == source_sha(FRAGILE) and fragile["origin"] == "generated"
    assert fragile["lineage"] == [{"sha": records["sort_words"]["sha"], "name": "sort_words"}]
    assert (fragile["difficulty"], fragile["difficulty_from"]) == (SERVING, "serving")
    assert (fragile["min_difficulty"], fragile["max_difficulty"]) == (1, 5)
    assert fragile["calibration"]["pass_rate"] == 0.5
    assert (records["sort_words"]["difficulty"], records["sort_words"]["difficulty_from"]) == (
        5,
        "middle",
    )


# ----------------------------------------------------------------------------- the package


def test_a_dataset_has_reasoning_gyms_shape_and_is_deterministic(pool: ModuleType) -> None:
    data = pool.create_dataset("fragile_sum", seed=7, size=5)
    assert len(data) == 5 and data.size == 5 and data.seed == 7
    items = list(data)
    assert items == [data[i] for i in range(5)] == list(pool.create_dataset("fragile_sum", 7, 5))
    for i, item in enumerate(items):
        assert set(item) == {"question", "answer", "metadata"}
        meta = item["metadata"]
        assert item["question"].endswith(shared.environment.ANSWER_INSTRUCTION)
        assert (meta["environment"], meta["seed"], meta["difficulty"]) == ("fragile_sum", 7 + i, 3)
        assert meta["sha"] == source_sha(FRAGILE) and meta["split"] == "train"
        assert meta["lineage"][0]["name"] == "sort_words" and meta["calibration"]["passes"] == 4
        assert item["answer"] == str(meta["instance"]["a"] + meta["instance"]["b"])
        assert pool.score_answer(item["answer"], item) == data.score_answer(item["answer"], item)
        assert pool.score_answer(item["answer"], item) == 1.0
        assert pool.score_answer("not a number", item) == 0.0
        assert pool.score_answer(None, item) == 0.0
    with pytest.raises(IndexError):
        data[5]
    assert (
        pool.create_dataset("fragile_sum", size=2, difficulty=5)[0]["metadata"]["difficulty"] == 5
    )
    with pytest.raises(ValueError, match="outside fragile_sum's range 1-5"):
        pool.create_dataset("fragile_sum", size=1, difficulty=6)
    with pytest.raises(ValueError, match="no environment 'nope'"):
        pool.create_dataset("nope")


def test_all_takes_every_environment_in_turn(pool: ModuleType) -> None:
    names = pool.names()
    data = pool.create_dataset("all", seed=0, size=2 * len(names), difficulty=1)
    assert [item["metadata"]["environment"] for item in data] == names * 2
    assert [item["metadata"]["seed"] for item in data] == list(range(2 * len(names)))
    assert {item["metadata"]["difficulty"] for item in data} == {1}  # every range holds 1
    answers = [item["answer"] for item in data]
    assert pool.score_answers(answers, list(data)) == [1.0] * len(data)
    assert pool.extract_answer(f"<think>x</think> so <answer> {answers[0]} </answer>") == answers[0]
    assert pool.extract_answer("<answer>1</answer><think>") is None


def test_training_data_never_reaches_the_evaluation_seeds(pool: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"split='eval'"):
        pool.create_dataset("sort_words", seed=10**9 - 2, size=3)
    assert pool.create_dataset("sort_words", seed=10**9 - 3, size=3)[2]["metadata"]["seed"] == (
        10**9 - 1
    )
    held_out = pool.create_dataset("sort_words", seed=0, size=2, split="eval")
    assert [item["metadata"]["seed"] for item in held_out] == [10**9, 10**9 + 1]
    assert {item["metadata"]["split"] for item in held_out} == {"eval"}
    with pytest.raises(ValueError, match="split must be"):
        pool.create_dataset("sort_words", split="test")


@pytest.mark.parametrize("in_process", [False, True])
def test_a_failing_scorer_scores_zero_with_a_warning(pool: ModuleType, in_process: bool) -> None:
    item = pool.create_dataset("fragile_sum", size=1, in_process=in_process)[0]
    for answer, reason in (("boom", "ValueError: boom"), ("big", "outside")):
        with pytest.warns(RuntimeWarning, match=f"fragile_sum: the scorer failed .*{reason}"):
            assert pool.score_answer(answer, item) == 0.0
    assert pool.score_answer(item["answer"], item) == 1.0


def test_a_scorer_that_never_returns_scores_zero_in_process(
    pool: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules["evoenv_pool.execution"], "IN_PROCESS_SECONDS", 0.3)
    item = pool.create_dataset("fragile_sum", size=1, in_process=True)[0]
    with pytest.warns(RuntimeWarning, match="no result within 0.3 s"):
        assert pool.score_answer("loop", item) == 0.0


def test_in_process_items_equal_the_sandboxs_and_shared_stays_the_projects(
    pool: ModuleType,
) -> None:
    project = sys.modules["shared"], sys.modules["shared.environment"]
    in_sandbox = list(pool.create_dataset("all", seed=3, size=22))
    here = list(pool.create_dataset("all", seed=3, size=22, in_process=True))
    for a, b in zip(in_sandbox, here, strict=True):
        assert a["question"] == b["question"] and a["answer"] == b["answer"]
        assert a["metadata"]["instance"] == b["metadata"]["instance"]
        assert pool.score_answer(b["answer"], b) == 1.0
    assert (sys.modules["shared"], sys.modules["shared.environment"]) == project
    assert importlib.import_module("shared.environment") is shared.environment
    assert Path(shared.__file__).parent == REPO / "shared"
    loaded = sys.modules["evoenv_pool.loaded.fragile_sum"].FragileSum
    assert loaded.__mro__[1] is sys.modules["evoenv_pool.environment"].Environment


WITHOUT_PROJECT = """
import json, sys
sys.path.insert(0, SITE)
import evoenv_pool
try:
    evoenv_pool.create_dataset("sort_words", size=2)
except evoenv_pool.SandboxNotAvailable as exc:
    refused = str(exc)
data = evoenv_pool.create_dataset("all", size=11, in_process=True)
print(json.dumps({
    "refused": refused,
    "scores": [evoenv_pool.score_answer(item["answer"], item) for item in data],
    "shared": [name for name in sys.modules if name.split(".")[0] == "shared"],
    "items": [{**item, "metadata": {**item["metadata"], "in_process": False}} for item in data],
}))
"""


def test_without_the_project_it_refuses_unless_asked_to_run_in_process(
    pool: ModuleType, site: Path, tmp_path: Path
) -> None:
    # -I -S: no site-packages (the project is not importable), no PYTHONPATH, no current folder
    code = WITHOUT_PROJECT.replace("SITE", repr(str(site)))
    done = run_isolated(code, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "EvoEnv project is not importable here" in result["refused"]
    assert "pass in_process=True" in result["refused"] and "\n" not in result["refused"]
    assert result["scores"] == [1.0] * 11 and result["shared"] == []
    assert result["items"] == list(pool.create_dataset("all", size=11))  # as in the sandbox
