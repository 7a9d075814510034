"""An exported EvoEnv pool as procedural datasets in reasoning-gym's shape: `create_dataset`,
`score_answer`, `extract_answer`. Part of the package `evoenv pool export --format
reasoning-gym` writes; standard library only."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # checked in EvoEnv's tree, where the export's copy does not exist
    from shared import environment as base
else:
    from . import environment as base
from .execution import runner

SPLITS = {"train": base.TRAIN_SEEDS, "eval": base.EVAL_SEEDS}
"""Instance seeds of each split: item i of a dataset uses seed `start + seed + i` of its split's
range. Training data never reaches into the evaluation range."""
ALL = "all"
"""The dataset name that mixes every exported environment."""


@cache
def _pool() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("pool.json").read_text("utf-8")
    return {env["name"]: env for env in json.loads(text)["environments"]}


@cache
def _source(name: str) -> str:
    return resources.files(__package__).joinpath("environments", f"{name}.py").read_text("utf-8")


def names() -> list[str]:
    """The exported environments' names, sorted."""
    return sorted(_pool())


def metadata(name: str) -> dict[str, Any]:
    """What the export recorded of one environment: sha, origin, lineage, calibration, serving
    and default difficulty, difficulty range, oracle kind, description."""
    return copy.deepcopy(_known(name))


def _known(name: str) -> dict[str, Any]:
    pool = _pool()
    if name not in pool:
        raise ValueError(f"no environment {name!r} in this export (known: {', '.join(names())})")
    return pool[name]


def extract_answer(completion: str) -> str | None:
    """The text of the completion's last <answer>...</answer> span after any thinking, stripped;
    None when there is none (a format error: it scores 0.0). EvoEnv's own extraction."""
    return base.extract_answer(completion).answer


class PoolDataset:
    """A fixed, deterministic list of items `{"question", "answer", "metadata"}`, as
    reasoning-gym's datasets give them: `len()`, indexing, iteration and `score_answer`."""

    def __init__(
        self,
        name: str,
        seed: int,
        split: str,
        items: list[dict[str, Any]],
        in_process: bool,
    ) -> None:
        self.name = name
        self.seed = seed
        self.size = len(items)
        self.split = split
        self.in_process = in_process
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return copy.deepcopy(self._items[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index in range(len(self._items)):
            yield self[index]

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        """The environment's own score of the extracted `answer` for `entry`, in [0, 1]."""
        return score_answer(answer, entry, in_process=self.in_process)


def create_dataset(
    name: str = ALL,
    seed: int = 0,
    size: int = 500,
    difficulty: int | None = None,
    *,
    split: str = "train",
    in_process: bool = False,
) -> PoolDataset:
    """`size` items of environment `name`, or of every exported environment in turn for "all"
    (item i from `names()[i % len(names())]`).

    Item i uses instance seed `start + seed + i`, where `start` begins the split's seed range
    (`SPLITS`): training items never come from the evaluation seeds; `split="eval"` asks for
    held-out ones. `difficulty` defaults to each environment's exported difficulty (its serving
    difficulty); a given one must lie in the environment's range, or, for "all", is clamped into
    each one's range. Environment code runs in EvoEnv's sandbox, which needs the EvoEnv project
    importable here; `in_process=True` runs it in this process instead, without isolation (for
    exports you trust), and the items' scoring follows them there.
    """
    chosen = names() if name == ALL else [_known(name)["name"]]
    seeds = _seeds(split, seed, size)
    plan: dict[str, list[tuple[int, int, int]]] = {env: [] for env in chosen}
    for i in range(size):
        env = chosen[i % len(chosen)]
        plan[env].append((i, seeds.start + seed + i, _difficulty(env, difficulty, name == ALL)))
    run = runner(in_process)
    items: list[dict[str, Any]] = [{}] * size
    for env, wanted in plan.items():
        if not wanted:
            continue
        made = run.instances(env, _source(env), [(s, d) for _, s, d in wanted])
        for (i, s, d), value in zip(wanted, made, strict=True):
            items[i] = _item(env, i, s, d, split, value, in_process)
    return PoolDataset(name, seed, split, items, in_process)


def _seeds(split: str, seed: int, size: int) -> range:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if type(seed) is not int or type(size) is not int or seed < 0 or size < 0:
        raise ValueError(f"seed and size must be integers >= 0, not {seed!r} and {size!r}")
    seeds = SPLITS[split]
    if seeds.start + seed + size > seeds.stop:
        held_out = " (held-out evaluation seeds are only served with split='eval')"
        raise ValueError(
            f"seeds {seed} to {seed + size - 1} run past the {split} split's "
            f"{len(seeds):,} seeds{held_out if split == 'train' else ''}"
        )
    return seeds


def _difficulty(name: str, difficulty: int | None, clamp: bool) -> int:
    env = _known(name)
    if difficulty is None:
        return int(env["difficulty"])
    lo, hi = env["min_difficulty"], env["max_difficulty"]
    if clamp:
        return min(max(difficulty, lo), hi)
    if not lo <= difficulty <= hi:
        raise ValueError(f"difficulty {difficulty} is outside {name}'s range {lo}-{hi}")
    return difficulty


def _item(
    name: str,
    index: int,
    seed: int,
    difficulty: int,
    split: str,
    value: dict[str, Any],
    in_process: bool,
) -> dict[str, Any]:
    env = _known(name)
    return {
        "question": base.build_prompt(value["prompt"]),
        "answer": value["answer_text"].strip(),
        "metadata": {
            "source_dataset": name,
            "source_index": index,
            "environment": name,
            "sha": env["sha"],
            "difficulty": difficulty,
            "seed": seed,
            "split": split,
            "oracle": env["oracle"],
            "origin": env["origin"],
            "lineage": env["lineage"],
            "calibration": env["calibration"],
            "serving_difficulty": env["serving_difficulty"],
            "instance": value["instance"],
            "reference": value["reference"],
            "in_process": in_process,
        },
    }


def score_answer(
    answer: str | None, entry: dict[str, Any], *, in_process: bool | None = None
) -> float:
    """The environment's own score of the extracted `answer` (see `extract_answer`) for a
    dataset item, in [0, 1]. None scores 0.0; a scorer that fails or overruns scores 0.0 with a
    `RuntimeWarning`, never an exception. `in_process` defaults to how the item was made."""
    return score_answers([answer], [entry], in_process=in_process)[0]


def score_answers(
    answers: Sequence[str | None],
    entries: Sequence[dict[str, Any]],
    *,
    in_process: bool | None = None,
) -> list[float]:
    """`score_answer` of many answers at once: one sandbox request per environment."""
    if len(answers) != len(entries):
        raise ValueError(f"{len(answers)} answers for {len(entries)} entries")
    rewards = [0.0] * len(answers)
    groups: dict[tuple[str, bool], list[tuple[int, tuple[str, Any, Any]]]] = {}
    for i, (answer, entry) in enumerate(zip(answers, entries, strict=True)):
        if answer is not None and not isinstance(answer, str):
            raise TypeError(f"an answer is a string or None, not {type(answer).__name__}")
        meta = entry["metadata"]
        env = _known(meta["environment"])
        if meta["sha"] != env["sha"]:
            raise ValueError(f"the entry's {env['name']} is not the one of this export")
        local = bool(meta.get("in_process")) if in_process is None else in_process
        if answer is not None:  # None: no answer span, a format error that scores 0.0
            graded = (answer, meta["instance"], meta["reference"])
            groups.setdefault((env["name"], local), []).append((i, graded))
    for (name, local), group in groups.items():
        indices = [i for i, _ in group]
        scores = runner(local).scores(name, _source(name), [graded for _, graded in group])
        for i, score in zip(indices, scores, strict=True):
            if score.reward is None:
                warnings.warn(
                    f"{name}: the scorer failed ({score.error}); the answer scores 0.0",
                    RuntimeWarning,
                    stacklevel=3,
                )
            else:
                rewards[i] = min(max(score.reward, 0.0), 1.0)
    return rewards
