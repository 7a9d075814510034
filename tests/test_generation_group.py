"""A generation group's end (`finalize_group`) against a real Redis and a SQLite archive: the
funnel, the rewards and what the archive keeps. The stage reports are written here as the
stages would have (no model); the embeddings are made-up unit vectors."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from evoenv_learner.pool import seed_pool
from evoenv_worker import tasks, verdict
from evoenv_worker.context import WorkerContext
from evoenv_worker.generation_groups import expire_group, finalize_group, open_group, propose
from evoenv_worker.novelty import DIMENSION, RECIPE
from evoenv_worker.verdict import CompletedGroup, after_mechanical, generation_key, job_failed
from shared.config import Settings
from shared.db import source_sha
from shared.groups import GroupTracker
from shared.messages import (
    MECHANICAL_STAGES,
    CandidateRef,
    CompletionRecord,
    ProposalJob,
    StageReport,
    ValidateJob,
    ValidationReport,
)
from shared.rollouts import EntryCheck

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
RUN = "gen-test"


def embedding(axis: int) -> dict[str, Any]:
    vector = [0.0] * DIMENSION
    vector[axis] = 1.0
    return {"recipe": RECIPE, "prompt": vector, "code": vector}


def passed_everything(name: str, axis: int, similarity: float) -> ValidationReport:
    """The report of a candidate that passed every stage, as the stages write it."""
    stages = [StageReport(stage=s, ok=True, seconds=0.0, detail="ok") for s in MECHANICAL_STAGES]
    stages += [
        StageReport(stage="review", ok=True, seconds=0.0, detail="ok"),
        StageReport(
            stage="calibration",
            ok=True,
            seconds=0.0,
            detail="ok",
            data={"pass_rate": 0.25, "passes": 2, "instances": 8, "difficulty": 1},
        ),
        StageReport(
            stage="novelty",
            ok=True,
            seconds=0.0,
            detail="ok",
            data={"similarity": similarity, "nearest": "x", "embedding": embedding(axis)},
        ),
    ]
    return ValidationReport(
        file=f"{name}.py", name=name, verdict="admitted", failed_stage=None, stages=stages
    )


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> WorkerContext:
    settings = Settings(redis_url=redis_url, data_dir=tmp_path, run=RUN)
    context = WorkerContext(settings)
    seed_pool(context.archive(), SEEDS)
    return context


def finish(ctx: WorkerContext, members: list[tuple[str, ValidationReport]]) -> Any:
    group_id = "g1"
    meta = {"prompt": "p", "parents": [], "completions": [{"text": s} for s, _ in members]}
    open_group(ctx, RUN, group_id, len(members), meta)
    tracker = GroupTracker(ctx.redis(), RUN)
    for index, (source, report) in enumerate(members):
        # as each candidate's last stage records it (`verdict.finalize_candidate`)
        ctx.archive().record_validation(
            f"{group_id}-{index}", source_sha(source), report, adhoc=False
        )
        member = {
            "report": report.model_dump(mode="json"),
            "sha": source_sha(source),
            "source": source,
        }
        tracker.finish(generation_key(group_id), str(index), member)
    return finalize_group(ctx, RUN, group_id)


def test_a_copy_of_a_seed_is_not_admitted_and_the_seed_is_left_alone(ctx: WorkerContext) -> None:
    copied = (SEEDS / "grid_shortest_path.py").read_text()
    new = copied.replace("grid_shortest_path", "grid_walk")
    archive = ctx.archive()
    seed_before = archive.environment(source_sha(copied))
    assert seed_before is not None

    group = finish(
        ctx,
        [
            # the novelty stage saw the seed (similarity 1.0 then), or an older worker did not
            (copied, passed_everything("grid_shortest_path", 0, 0.5)),
            (new, passed_everything("grid_walk", 1, 0.5)),
        ],
    )

    assert group.data.funnel == ["novelty", "admitted"]
    copy_reward, new_reward = (c.reward for c in group.completions)
    assert copy_reward is not None and new_reward is not None
    assert copy_reward < new_reward  # no novelty bonus for the copy
    seed_after = archive.environment(source_sha(copied))
    assert seed_after is not None
    assert (seed_after.status, seed_after.stats) == (seed_before.status, seed_before.stats)
    admitted = archive.environment(source_sha(new))
    assert admitted is not None and admitted.status == "admitted"
    assert admitted.stats.funnel == "admitted"
    calibration = {"pass_rate": 0.25, "passes": 2, "instances": 8, "difficulty": 1}
    assert admitted.stats.to_json()["calibration"] == calibration  # kept with the admission
    # The copy's report said admitted (every stage passed); it now says what the group decided.
    copy_report = archive.validation("g1-0")
    assert copy_report is not None
    assert (copy_report.verdict, copy_report.failed_stage) == ("rejected", "novelty")
    assert "known environment (seed)" in copy_report.stages[-1].detail
    new_report = archive.validation("g1-1")
    assert new_report is not None and new_report.verdict == "admitted"


def test_a_candidate_like_an_earlier_one_of_its_group_is_rejected_and_its_report_says_so(
    ctx: WorkerContext,
) -> None:
    first = (SEEDS / "grid_shortest_path.py").read_text().replace("grid_shortest_path", "walk_a")
    second = first.replace("walk_a", "walk_b")
    group = finish(
        ctx,
        [  # the same made-up embedding: in-group similarity 1.0
            (first, passed_everything("walk_a", 2, 0.5)),
            (second, passed_everything("walk_b", 2, 0.5)),
        ],
    )
    assert group.data.funnel == ["admitted", "novelty"]
    archive = ctx.archive()
    kept = archive.environment(source_sha(first))
    dropped = archive.environment(source_sha(second))
    assert kept is not None and dropped is not None
    assert (kept.status, dropped.status) == ("admitted", "rejected")
    report = archive.validation("g1-1")
    assert report is not None
    assert (report.verdict, report.failed_stage) == ("rejected", "novelty")
    novelty = report.stages[-1]
    assert not novelty.ok and "to candidate 0 of its generation group" in novelty.detail
    assert novelty.data["similarity"] == pytest.approx(1.0)
    stored = archive.validation("g1-0")
    assert stored is not None and stored.verdict == "admitted"


def test_an_expired_group_is_recorded_as_such_and_nothing_of_it_reaches_the_stream(
    ctx: WorkerContext,
) -> None:
    done = (SEEDS / "grid_shortest_path.py").read_text().replace("grid_shortest_path", "grid_hop")
    late = "class Late(Environment):\n    pass\n"
    meta = {
        "prompt": "p",
        "parents": ["parent-sha"],
        "completions": [{"text": f"```python\n{s}```"} for s in (done, late)],
    }
    open_group(ctx, RUN, "g2", 2, meta)
    tracker = GroupTracker(ctx.redis(), RUN)
    report = passed_everything("grid_hop", 1, 0.5)
    member = {"report": report.model_dump(mode="json"), "sha": source_sha(done), "source": done}
    assert tracker.finish(generation_key("g2"), "0", member) is False  # candidate 1 still runs

    assert expire_group(ctx, RUN, "g2", "not in the stream 60 s after it was sent") is True
    archive = ctx.archive()
    row = archive.environment(source_sha(done))
    assert row is not None and row.status == "rejected" and row.parents == ["parent-sha"]
    assert row.stats.funnel == "expired" and row.stats.to_json()["reward"] is None
    assert row.stats.expired is not None and "60 s" in row.stats.expired
    running = archive.validation("g2-1")
    assert running is not None and running.verdict == "error"
    assert running.error is not None and running.error.startswith("expired: ")
    # The running candidate ends late: its group does not complete, nothing is appended.
    assert tracker.finish(generation_key("g2"), "1", {"report": None}) is False
    assert ctx.redis().xlen(f"evoenv:{RUN}:rollouts") == 0
    assert expire_group(ctx, RUN, "g2", "again") is False


def test_a_group_that_completed_first_does_not_expire(ctx: WorkerContext) -> None:
    finish(ctx, [("class A: pass\n", passed_everything("a_thing", 2, 0.2))])
    assert expire_group(ctx, RUN, "g1", "too late") is False
    row = ctx.archive().environment(source_sha("class A: pass\n"))
    assert row is not None and row.stats.funnel == "admitted"


def test_a_group_whose_proposal_never_ran_expires_with_no_records(ctx: WorkerContext) -> None:
    assert expire_group(ctx, RUN, "g3", "its proposal failed: boom") is True
    open_group(ctx, RUN, "g3", 2, {"prompt": "p", "completions": [{"text": ""}] * 2})
    assert GroupTracker(ctx.redis(), RUN).results(generation_key("g3")) == {}, "stays closed"


class NoModel:
    def chat(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an expired group's proposal must not sample")


def test_the_proposal_of_an_expired_group_samples_and_sends_nothing(ctx: WorkerContext) -> None:
    job = ProposalJob(
        run=RUN, group_id="g4", messages=[], parents=[], group_size=2, temperature=0.7, max_tokens=8
    )
    assert expire_group(ctx, RUN, "g4", "not in the stream 60 s after it was sent") is True
    ctx._inference = NoModel()  # type: ignore[assignment]
    assert propose(ctx, job) == []


def candidate_job(group_id: str, index: int, source: str) -> ValidateJob:
    completion = CompletionRecord(text=f"```python\n{source}```")
    ref = CandidateRef(run=RUN, group_id=group_id, index=index, prompt="p", completion=completion)
    return ValidateJob(
        job_id=f"{group_id}-{index}",
        file=f"candidate_{group_id}_{index}.py",
        source=source,
        adhoc=False,
        model_stages=True,
        candidate=ref,
    )


def test_admission_says_which_group_completed_and_the_task_layer_finalises_it(
    ctx: WorkerContext,
) -> None:
    """Candidate 0 fails L1 (concluded after L1-L5); candidate 1's validation job fails for
    good. Admission finalises nothing: the last one's path returns its group, and the task
    layer's `finalize_completed` puts it on the stream."""
    sources = ["class A: pass\n", "class B: pass\n"]
    meta = {"prompt": "p", "parents": [], "completions": [{"text": s} for s in sources]}
    open_group(ctx, RUN, "g5", 2, meta)
    l1 = StageReport(stage="L1", ok=False, seconds=0.0, detail="no")
    failed = ValidationReport(
        file="a.py", name="a_thing", verdict="rejected", failed_stage="L1", stages=[l1]
    )
    first = after_mechanical(ctx, candidate_job("g5", 0, sources[0]), failed)
    assert isinstance(first, verdict.Concluded) and first.completed is None
    assert first.report.verdict == "rejected"
    payload = candidate_job("g5", 1, sources[1]).model_dump(mode="json")

    completed = job_failed(ctx, "evoenv.validate", payload, "boom")

    assert completed == CompletedGroup(RUN, "g5")
    assert ctx.redis().xlen(f"evoenv:{RUN}:rollouts") == 0  # not finalised by admission
    tasks.finalize_completed(ctx, completed)
    ((_, fields),) = ctx.redis().xrange(f"evoenv:{RUN}:rollouts")
    # signed with the data folder's key, which the learner beside the worker checks it with
    assert EntryCheck.of(ctx.settings).forged(f"evoenv:{RUN}:rollouts", fields) is None
    assert job_failed(ctx, "evoenv.review", {"not": "a stage job"}, "boom") is None


def test_admission_never_imports_generation() -> None:
    """One way through admission: `generation` uses `admission`, never the other way round."""
    tree = ast.parse(Path(verdict.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("evoenv_worker.generation_groups")}
