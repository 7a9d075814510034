"""An exported EvoEnv pool as a verifiers v1 taskset (verifiers 0.4.0: `vf-eval evoenv-pool`):
its tasks are the seeded instances of `verifiers_env.rows`, each rewarded by its environment's
own scorer (`verifiers_env.score`). Part of the package `evoenv pool export --format verifiers`
writes; needs verifiers 0.4.0."""

from __future__ import annotations

import asyncio
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from .dataset import ALL, extract_answer
from .verifiers_env import rows, score


class EvoEnvPoolData(vf.TaskData):
    """One instance: `prompt` (the full prompt), `name` (its environment), `id` (environment,
    split, seed and difficulty), and the row's `answer` and `info` (`verifiers_env.rows`)."""

    answer: str = ""
    """The reference answer, as a perfect solver writes it."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Environment, sha, seed, difficulty, split, instance and reference (JSON text)."""


class EvoEnvPoolTask(vf.Task[EvoEnvPoolData]):
    """A seeded instance, scored by its environment's own scorer."""

    @vf.reward
    async def evoenv_score(self, trace: Any) -> float:
        """The scorer on the answer of the agent's last reply (EvoEnv's `extract_answer`), in a
        thread: a sandbox request does not hold the event loop."""
        return await asyncio.to_thread(score, extract_answer(trace.last_reply), self.data.info)

    async def validate(self, runtime: Any) -> bool:
        """The reference answer scores 1.0 (`vf-validate`'s gold check)."""
        return await asyncio.to_thread(score, self.data.answer, self.data.info) == 1.0


class EvoEnvPoolConfig(vf.TasksetConfig):
    """`--env.taskset.*`: which instances, as `create_dataset` takes them."""

    environment: str = ALL
    """One environment's name, or "all" for every exported environment in turn."""
    seed: int = 0
    """Task i uses instance seed `seed + i` of the split's range."""
    size: int = 100
    """How many tasks."""
    difficulty: int | None = None
    """None for each environment's exported difficulty."""
    split: str = "train"
    """"train", or "eval" for the held-out seeds EvoEnv reserves for evaluation."""
    in_process: bool = False
    """Run the environments' code in this process, without isolation (trusted exports only)."""


class EvoEnvPoolTaskset(vf.Taskset[EvoEnvPoolTask, EvoEnvPoolConfig]):
    """The tasks `EvoEnvPoolConfig` names, made in EvoEnv's sandbox (or in process)."""

    def load(self) -> list[EvoEnvPoolTask]:
        c = self.config
        made = rows(
            c.environment, c.seed, c.size, c.difficulty, split=c.split, in_process=c.in_process
        )
        tasks = []
        for row in made:
            info = row["info"]
            data = EvoEnvPoolData(
                id=f"{info['environment']}/{info['split']}/{info['seed']}/{info['difficulty']}",
                name=info["environment"],
                prompt=row["prompt"][0]["content"],
                answer=row["answer"],
                info=info,
            )
            tasks.append(EvoEnvPoolTask(data, c.task))
        return tasks
