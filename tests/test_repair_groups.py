"""Proposal modes in the worker against a real Redis and a SQLite archive: the mode a generation
group records (on the stream and in the archive's metrics), the own-task line kept per
candidate, and repair groups (one more turn per candidate that failed L1-L5, trained as a
group of their own). No model: a fake one answers; stage reports are written as the stages
would have."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from evoenv_learner.grpo import group_advantages
from evoenv_learner.pool import seed_pool
from evoenv_worker.context import WorkerContext
from evoenv_worker.generation_groups import finalize_group, propose
from evoenv_worker.verdict import generation_key
from shared.config import GrpoSettings, Settings
from shared.db import source_sha
from shared.groups import GroupTracker
from shared.inference import Completion, Sampling
from shared.messages import (
    MECHANICAL_STAGES,
    GeneratorGroupData,
    GradedGroup,
    ProposalJob,
    StageReport,
    Trigger,
    ValidateJob,
    ValidationReport,
)
from shared.proposal_modes import own_task_messages
from shared.proposal_prompt import Example, proposal_messages
from shared.rollouts import decode_entry
from tests.test_generation_group import passed_everything

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
RUN = "modes-test"
SORT = Example("sort_words", "equality", (SEEDS / "sort_words.py").read_text(), "sha-sort")


class FakeModel:
    """Answers each request with the next replies, in order; remembers what it was asked."""

    def __init__(self, replies: Iterable[str]) -> None:
        self.replies = iter(replies)
        self.asked: list[tuple[list[dict[str, str]], int]] = []
        self.lock = threading.Lock()

    def chat(self, messages: list[dict[str, str]], sampling: Sampling) -> list[Completion]:
        with self.lock:
            self.asked.append((list(messages), sampling.n))
            texts = [next(self.replies) for _ in range(sampling.n)]
        return [
            Completion(
                text=text,
                prompt_token_ids=list(range(len(messages))),
                token_ids=[1, 2],
                logprobs=[-0.1, -0.2],
                finish_reason="stop",
                policy_version=0,
                version_source="none",
                server="fake",
            )
            for text in texts
        ]


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> WorkerContext:
    context = WorkerContext(Settings(redis_url=redis_url, data_dir=tmp_path, run=RUN))
    seed_pool(context.archive(), SEEDS)
    return context


def fenced(name: str) -> str:
    return f"```python\nclass {name}:\n    pass\n```"


def failed_at(stage: str, detail: str, trigger: Trigger | None = None) -> ValidationReport:
    before = MECHANICAL_STAGES[: MECHANICAL_STAGES.index(stage)]  # type: ignore[arg-type]
    stages = [StageReport(stage=s, ok=True, seconds=0.0, detail="ok") for s in before]
    stages.append(StageReport(stage=stage, ok=False, seconds=0.0, detail=detail, trigger=trigger))  # type: ignore[arg-type]
    return ValidationReport(
        file="c.py",
        name="c",
        verdict="rejected",
        failed_stage=stage,
        stages=stages,  # type: ignore[arg-type]
    )


def judged(
    ctx: WorkerContext, jobs: list[ValidateJob], reports: list[ValidationReport]
) -> GradedGroup:
    """Each candidate concluded with its report (as admission would), then the group's end."""
    assert len(jobs) == len(reports)
    tracker = GroupTracker(ctx.redis(), RUN)
    for job, report in zip(jobs, reports, strict=True):
        assert job.candidate is not None
        ctx.archive().record_validation(job.job_id, source_sha(job.source), report, adhoc=False)
        member = {
            "report": report.model_dump(mode="json"),
            "sha": source_sha(job.source),
            "source": job.source,
        }
        tracker.finish(generation_key(job.candidate.group_id), str(job.candidate.index), member)
    return finalize_group(ctx, RUN, jobs[0].candidate.group_id)  # type: ignore[union-attr]


def metrics(ctx: WorkerContext) -> dict[str, dict[str, Any]]:
    return {row.values["group_id"]: row.values for row in ctx.archive().metrics(RUN, "generation")}


def stream(ctx: WorkerContext) -> list[GradedGroup]:
    return [decode_entry(fields) for _, fields in ctx.redis().xrange(f"evoenv:{RUN}:rollouts")]


def test_an_own_task_group_records_its_mode_and_each_candidates_task(ctx: WorkerContext) -> None:
    replies = [f"Task: the median of a list\n{fenced('Median')}", fenced("NoTaskLine")]
    ctx._inference = FakeModel(replies)  # type: ignore[assignment]
    job = ProposalJob(
        run=RUN, group_id="own1", messages=own_task_messages([SORT]), group_size=2, mode="own_task"
    )
    jobs = propose(ctx, job)
    assert [j.source for j in jobs] == [
        "class Median:\n    pass\n",
        "class NoTaskLine:\n    pass\n",
    ]

    group = judged(ctx, jobs, [failed_at("L1", "no Environment"), failed_at("L2", "boom")])

    assert isinstance(group.data, GeneratorGroupData) and group.data.mode == "own_task"
    assert stream(ctx)[0].data == group.data  # on the stream as such
    recorded = metrics(ctx)["own1"]
    assert recorded["mode"] == "own_task"
    assert [c.get("task") for c in recorded["candidates"]] == ["the median of a list", None]


def test_a_topic_group_records_its_mode(ctx: WorkerContext) -> None:
    ctx._inference = FakeModel([fenced("A"), fenced("B")])  # type: ignore[assignment]
    job = ProposalJob(run=RUN, group_id="t1", messages=proposal_messages([SORT], "x"), group_size=2)
    group = judged(ctx, propose(ctx, job), [failed_at("L1", "a"), failed_at("L2", "b")])
    assert isinstance(group.data, GeneratorGroupData)
    assert (group.data.mode, group.data.repair_of) == ("topic", None)
    assert metrics(ctx)["t1"]["mode"] == "topic" and "repair_of" not in metrics(ctx)["t1"]


def topic_group(ctx: WorkerContext) -> tuple[list[dict[str, str]], list[str]]:
    """Group g1, finished: candidate 0 fails L2 on seed 3 at difficulty 5, candidate 1 passes
    every stage, candidate 2 fails L1."""
    asked = proposal_messages([SORT], "the median of a list of integers")
    replies = [fenced("Broken"), fenced("Fine"), "I cannot write that."]
    ctx._inference = FakeModel(replies)  # type: ignore[assignment]
    job = ProposalJob(run=RUN, group_id="g1", messages=asked, group_size=3, parents=["sha-sort"])
    fine = (SEEDS / "grid_shortest_path.py").read_text().replace("grid_shortest_path", "walk")
    jobs = propose(ctx, job)
    jobs[1] = jobs[1].model_copy(update={"source": fine})
    l2 = failed_at("L2", "sample raised KeyError: 'values'", Trigger(seed=3, difficulty=5))
    reports = [l2, passed_everything("walk", 0, 0.5), failed_at("L1", "no class")]
    judged(ctx, jobs, reports)
    return asked, replies


def test_a_repair_group_asks_one_more_turn_per_l1_to_l5_failure_with_its_report(
    ctx: WorkerContext,
) -> None:
    asked, replies = topic_group(ctx)
    model = FakeModel([fenced("Repaired0"), fenced("Repaired2")])
    ctx._inference = model  # type: ignore[assignment]
    job = ProposalJob(
        run=RUN, group_id="r1", messages=[], group_size=4, mode="repair", repair_of="g1"
    )

    jobs = propose(ctx, job)

    assert len(jobs) == 2 and len(model.asked) == 2  # candidates 0 and 2; 1 passed L1-L5
    by_reply = {messages[-2]["content"]: messages for messages, _ in model.asked}
    assert set(by_reply) == {replies[0], replies[2]}
    for messages, n in model.asked:
        assert n == 1 and messages[: len(asked)] == asked  # the proposal's own conversation
        assert messages[len(asked)]["role"] == "assistant"
    l2_turn = by_reply[replies[0]][-1]["content"]
    assert "stage L2" in l2_turn and "KeyError: 'values'" in l2_turn
    assert "seed 3 at difficulty 5" in l2_turn
    assert "stage L1" in by_reply[replies[2]][-1]["content"]
    ref = jobs[0].candidate
    assert ref is not None and ref.parents == ["sha-sort"]  # the repaired group's lineage
    assert "stage L" in ref.prompt  # each candidate's own repair prompt


def test_a_repair_groups_advantages_are_computed_among_its_repairs_only(
    ctx: WorkerContext,
) -> None:
    topic_group(ctx)
    ctx._inference = FakeModel([fenced("Repaired0"), fenced("Repaired2")])  # type: ignore[assignment]
    job = ProposalJob(
        run=RUN, group_id="r1", messages=[], group_size=4, mode="repair", repair_of="g1"
    )
    jobs = propose(ctx, job)
    fixed = (SEEDS / "edit_distance.py").read_text().replace("edit_distance", "edits_fixed")
    jobs[0] = jobs[0].model_copy(update={"source": fixed})

    repairs = judged(ctx, jobs, [passed_everything("edits_fixed", 1, 0.5), failed_at("L3", "x")])

    original, repaired = stream(ctx)
    assert (original.group_id, repaired.group_id) == ("g1", "r1")  # a group of its own
    assert repaired == repairs
    assert isinstance(repaired.data, GeneratorGroupData)
    assert (repaired.data.mode, repaired.data.repair_of) == ("repair", "g1")
    assert [c.text for c in repaired.completions] == [fenced("Repaired0"), fenced("Repaired2")]
    assert repaired.data.funnel == ["admitted", "L3"]
    # its baseline is its own: the repairs' rewards alone, whatever the original group earned
    grpo = GrpoSettings()
    rewards = [c.reward for c in repaired.completions]
    advantages = group_advantages(rewards, "generator", grpo)
    assert advantages is not None
    scale = grpo.generator_advantage_scale
    assert advantages.tolist() == pytest.approx([scale, -scale], abs=1e-5)
    pooled = group_advantages(rewards + [c.reward for c in original.completions], "generator", grpo)
    assert pooled is not None and pooled[:2].tolist() != pytest.approx(advantages.tolist())
    recorded = metrics(ctx)
    assert (recorded["r1"]["mode"], recorded["r1"]["repair_of"]) == ("repair", "g1")
    assert recorded["g1"]["mode"] == "topic"


def test_nothing_to_repair_asks_nothing(ctx: WorkerContext) -> None:
    topic_group(ctx)
    ctx._inference = FakeModel([fenced("R0"), fenced("R2")])  # type: ignore[assignment]
    repair = ProposalJob(
        run=RUN, group_id="r1", messages=[], group_size=4, mode="repair", repair_of="g1"
    )
    judged(ctx, propose(ctx, repair), [failed_at("L1", "a"), failed_at("L2", "b")])
    model = FakeModel([])
    ctx._inference = model  # type: ignore[assignment]
    for group_id in ("r1", "unknown"):  # a repair group is not repaired; a group gone has nothing
        again = repair.model_copy(update={"group_id": f"r-{group_id}", "repair_of": group_id})
        assert propose(ctx, again) == []
    assert model.asked == []
