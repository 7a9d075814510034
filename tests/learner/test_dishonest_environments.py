"""Training on a dishonest environment, by the cheapest real path: its solver groups graded in
the sandbox with hidden probes (`grade.grade_group`), appended signed to a real Redis stream,
and read by the learner's own consume and train tasks (the pool on an archive; a stand-in
trainer records the batches). For each of three kinds (a scorer reading the runner's frames,
one recognising the validation seeds, one with a lottery) the environment is quarantined
before a step uses a reward it gave dishonestly: its groups are dropped where read or at the
step that would use them, and the seed's groups beside them are trained."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from structlog.testing import capture_logs
from support import started_sandbox

from evoenv_learner.consumer import RolloutConsumer
from evoenv_learner.loop import Learner, LearnerState
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.pool import Pool
from evoenv_worker.grade import grade_group
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.db import Archive, source_sha
from shared.messages import CompletionRecord, EnvRef, GradedGroup, SolverJob
from shared.rollouts import EntryCheck, append_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
DISHONEST = REPO / "tests" / "corpus" / "dishonest"
SEED = REPO / "seeds" / "sort_words.py"
RUN = "dishonest"
DIFFICULTY = 2


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    yield from started_sandbox(Settings().sandbox)


class Trainer:
    """Takes the steps the loop hands it and keeps their batches; no model."""

    def __init__(self) -> None:
        self.model = None
        self.step_count = 0
        self.batches: list[list[GradedGroup]] = []
        self.interrupt = asyncio.Event()

    def step(self, batch: list[GradedGroup]) -> Any:
        self.batches.append(list(batch))
        self.step_count += 1
        return type("Metrics", (), {"as_dict": lambda self: {}})()

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


class Quiet:
    """The publisher and the metrics sink: nothing to push to, nothing to write."""

    pauses_servers = False

    def train(self, *args: Any) -> None:
        pass

    def samples(self, *args: Any) -> None:
        pass


async def no_backlog() -> int:
    return 0


def graded(sandbox: Sandbox, path: Path, seed: int, settings: Settings) -> GradedGroup:
    """A group of eight answers to the instance: two right, four wrong, two without a span."""
    source = path.read_text()
    (made,) = sandbox.run(source, [{"op": "instance", "seed": seed, "difficulty": DIFFICULTY}])
    right = made.value["answer_text"]
    texts = [f"<answer>{right}</answer>"] * 2 + ["<answer>0</answer>"] * 4 + ["no span"] * 2
    job = SolverJob(
        run=RUN,
        group_id=f"{path.stem}-{seed}",
        env=EnvRef(name=path.stem, sha=source_sha(source), source=source),
        seed=seed,
        difficulty=DIFFICULTY,
        group_size=len(texts),
        prompt="p",
        completions=[
            CompletionRecord(text=text, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5])
            for text in texts
        ],
    )
    return grade_group(sandbox, job, settings)


@pytest.mark.parametrize(
    ("name", "seeds", "dropped_at_step"),
    [
        ("frames_batch_only.py", [103, 104, 105], 0),
        ("validation_seed_recogniser.py", [103, 104, 105], 0),
        # 162-164 are honest instances, queued for a step; the lottery accepts any answer on
        # 165 (the first seed past 100 where it does), which quarantines it before that step
        ("lottery.py", [162, 163, 164, 165, 166, 167], 3),
    ],
)
def test_a_dishonest_environment_is_quarantined_before_a_step_uses_its_rewards(
    sandbox: Sandbox,
    redis_url: str,
    tmp_path: Path,
    name: str,
    seeds: list[int],
    dropped_at_step: int,
) -> None:
    settings = Settings(
        redis_url=redis_url,
        data_dir=tmp_path,
        run=RUN,
        stream_key="k" * 32,
        pool={"probe_rate": 1.0, "rescore_rate": 0.0},
        grpo={"batch_groups": 4},
        learner={"push_every": 1000, "eval_every": 1000, "checkpoint_every": 1000},
    )
    path = DISHONEST / name
    archive = Archive(settings.archive_url)
    hostile = archive.add_environment(
        path.stem, path.read_text(), status="admitted", origin="generated"
    )
    archive.add_environment("sort_words", SEED.read_text(), status="seed", origin="seed")
    hostile_groups = [graded(sandbox, path, seed, settings) for seed in seeds]
    honest_groups = [graded(sandbox, SEED, seed, settings) for seed in range(8)]
    assert not any(group.data.dishonest for group in honest_groups)
    first_marked = next(k for k, group in enumerate(hostile_groups) if group.data.dishonest)
    assert all(len({c.reward for c in g.completions}) > 1 for g in hostile_groups), (
        "each hostile group has reward spread: a step would learn from it"
    )
    client = redis.Redis.from_url(redis_url)
    key = EntryCheck.of(settings).key
    for group in [*hostile_groups, *honest_groups]:  # the hostile ones are read first
        append_group(client, group, key)
    client.close()

    trainer = Trainer()
    pool = Pool(archive, settings.pool)
    with capture_logs() as logs:
        state = asyncio.run(learn(settings, pool, trainer, steps=2))

    trained = [group for batch in trainer.batches for group in batch]
    assert [g.group_id for g in trained] == [g.group_id for g in honest_groups]
    row = archive.environment(hostile)
    assert row is not None and row.status == "quarantined"
    assert row.stats.quarantine is not None
    assert row.stats.quarantine.reason.startswith("dishonest: a hidden probe: the ")
    assert pool.quarantined(hostile) and hostile not in pool
    # every group of it is dropped: those queued before the quarantine at the step, the
    # marked one and those after it where they are read
    at_step = [e for e in logs if e["event"] == "group_dropped_quarantined_at_step"]
    assert len(at_step) == first_marked == dropped_at_step
    assert state.quarantined_dropped == len(seeds)


async def learn(settings: Settings, pool: Pool, trainer: Trainer, steps: int) -> LearnerState:
    """The learner's consume and train tasks over the stream until `steps` steps are taken."""
    client = aioredis.Redis.from_url(settings.redis_url)
    consumer = RolloutConsumer(client, RUN, "learner", 4, EntryCheck.of(settings))
    await consumer.start()
    state = LearnerState()
    learner = Learner(
        settings=settings,
        state=state,
        pool=pool,
        sync_redis=None,  # type: ignore[arg-type]
        client=client,
        model_path=Path("unused"),
        trainer=trainer,  # type: ignore[arg-type]
        publisher=Quiet(),  # type: ignore[arg-type]
        take_turns=False,
        consumer=consumer,
        rng=random.Random(0),
        orchestrator=Orchestrator(settings, pool=pool, backlog=no_backlog),
        metrics=Quiet(),  # type: ignore[arg-type]
        on_step=None,
        republish=None,
        queue=asyncio.Queue(maxsize=8),
    )
    tasks = [asyncio.create_task(learner.consume()), asyncio.create_task(learner.train())]
    try:
        async with asyncio.timeout(120):
            while state.step < steps:
                await asyncio.sleep(0.05)
    finally:
        learner.stop.set()
        await asyncio.gather(*tasks)
        await client.aclose()
    return state
