"""An exported EvoEnv pool as a verifiers environment: `rows` (over `create_dataset`) and `score`
(over `score_answers`), which both of verifiers' APIs use, and `load_environment` for its legacy
one (0.3.1: a single-turn environment with a rubric). Part of the package `evoenv pool export
--format verifiers` writes; `load_environment` needs verifiers and `datasets`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from .dataset import ALL, create_dataset, extract_answer, score_answers

INFO_KEYS = ("environment", "sha", "seed", "difficulty", "split")
"""What a row's `info` says of its instance, beside the instance and reference themselves."""


def rows(
    environment: str = ALL,
    seed: int = 0,
    size: int = 100,
    difficulty: int | None = None,
    *,
    split: str = "train",
    in_process: bool = False,
) -> list[dict[str, Any]]:
    """The items of `create_dataset(environment, seed, size, difficulty, split=split,
    in_process=in_process)` as verifiers rows with the same columns for every environment:
    `prompt` (one user message, the full prompt), `answer` (the reference answer text) and `info`
    (`INFO_KEYS`, then `instance` and `reference` as JSON text, and `in_process`)."""
    data = create_dataset(environment, seed, size, difficulty, split=split, in_process=in_process)
    made = []
    for item in data:
        meta = item["metadata"]
        info = {key: meta[key] for key in INFO_KEYS}
        info["instance"] = json.dumps(meta["instance"])
        info["reference"] = json.dumps(meta["reference"])
        info["in_process"] = bool(meta["in_process"])
        prompt = [{"role": "user", "content": item["question"]}]
        made.append({"prompt": prompt, "answer": item["answer"], "info": info})
    return made


def score(answer: str | None, info: Mapping[str, Any]) -> float:
    """The environment's own score of an extracted `answer` (see `extract_answer`; None scores
    0.0) for the row whose `info` is given, in [0, 1]: `score_answer`, in EvoEnv's sandbox unless
    the row was made `in_process`."""
    return scores([answer], [info])[0]


def scores(answers: list[str | None], infos: list[Mapping[str, Any]]) -> list[float]:
    """`score` of many answers at once: one sandbox request per environment."""
    entries = [
        {
            "metadata": {
                "environment": info["environment"],
                "sha": info["sha"],
                "instance": json.loads(info["instance"]),
                "reference": json.loads(info["reference"]),
                "in_process": bool(info["in_process"]),
            }
        }
        for info in infos
    ]
    return score_answers(answers, entries)


def load_environment(
    environment: str = ALL,
    seed: int = 0,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    difficulty: int | None = None,
    system_prompt: str | None = None,
    in_process: bool = False,
) -> Any:
    """verifiers' legacy API (`verifiers.legacy`, 0.3.1: `vf.load_environment("evoenv-pool",
    **kwargs)`, `vf-eval evoenv-pool`): a `vf.SingleTurnEnv` over `rows(environment, seed,
    num_train_examples, difficulty, split="train")`, its evaluation dataset the same number
    `num_eval_examples` of the evaluation seeds (`split="eval"`), each made when first asked
    for, and a rubric of one reward, `evoenv_score`: the environment's own scorer on the last
    reply's answer, extracted by EvoEnv's `extract_answer` (the environment's parser)."""
    import verifiers as vf  # verifiers 0.3.1 answers the legacy API at its top level
    from datasets import Dataset

    parser = vf.Parser(extract_fn=extract_answer)

    async def evoenv_score(completion: Any, info: Mapping[str, Any]) -> float:
        # in a thread: a sandbox request does not hold verifiers' event loop
        return await asyncio.to_thread(score, parser.parse_answer(completion), info)

    def dataset(split: str, size: int) -> Any:
        made = rows(environment, seed, size, difficulty, split=split, in_process=in_process)
        return Dataset.from_list(made)

    return vf.SingleTurnEnv(
        dataset=lambda: dataset("train", num_train_examples),
        eval_dataset=lambda: dataset("eval", num_eval_examples),
        system_prompt=system_prompt,
        parser=parser,
        rubric=vf.Rubric(funcs=[evoenv_score], parser=parser),
    )
