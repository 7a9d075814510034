"""The generator's rewards of whole generation groups, through `finalize_group` (the path that
turns candidates' reports into rewards) and on to GRPO's advantages: a copy never pays, an
invention pays most, failures are graded, review verdicts change no reward, in-group novelty
counts survivors only, and a file is rewarded as the model wrote it. Against a real Redis and
a SQLite archive; the model stages' reports are written here as the stages would write them."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from evoenv_learner.grpo import group_advantages
from evoenv_learner.pool import seed_pool
from evoenv_worker import tasks
from evoenv_worker.context import WorkerContext
from evoenv_worker.generation_groups import finalize_group, open_group, propose
from evoenv_worker.mechanical import validate_job
from evoenv_worker.novelty import DIMENSION, RECIPE
from evoenv_worker.proposal_code import prompt_text, repaired_code, repairs
from evoenv_worker.verdict import Concluded, after_mechanical, combine, generation_key
from shared.config import GrpoSettings, Settings
from shared.db import source_sha
from shared.groups import GroupTracker
from shared.inference import Completion
from shared.messages import (
    MECHANICAL_STAGES,
    GradedGroup,
    ProposalJob,
    StageReport,
    ValidationReport,
)
from shared.proposal_prompt import Example, proposal_messages
from shared.rollouts import decode_entry
from shared.static import check_static

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
RUN = "reward-test"
EXAMPLE = (SEEDS / "grid_shortest_path.py").read_text()
"""The proposal prompt's example: a copy of it is the very file of a seed."""


def embedding(degrees: float) -> dict[str, Any]:
    """A made-up unit embedding in the plane of the first two axes: two of them are as similar
    as the cosine of the angle between them."""
    vector = [0.0] * DIMENSION
    vector[0], vector[1] = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return {"recipe": RECIPE, "prompt": vector, "code": vector}


def judged(
    name: str,
    *,
    failed: str | None = None,
    review: bool = True,
    pass_rate: float = 0.25,
    similarity: float = 0.3,
    degrees: float = 0.0,
) -> ValidationReport:
    """A candidate's full report as admission writes it: L1-L5 up to `failed`, else the three
    model stages (calibration passes for 0 < a < 1, novelty below the 0.80 gate) combined by
    admission's own `combine`."""
    mechanical = []
    for stage in MECHANICAL_STAGES:
        mechanical.append(StageReport(stage=stage, ok=stage != failed, seconds=0.0, detail="x"))
        if stage == failed:
            return ValidationReport(
                file=f"{name}.py", name=name, verdict="rejected", failed_stage=failed,
                stages=mechanical,
            )  # fmt: skip
    passed = ValidationReport(
        file=f"{name}.py", name=name, verdict="admitted", failed_stage=None, stages=mechanical
    )
    calibration = {"pass_rate": pass_rate, "passes": round(8 * pass_rate), "instances": 8}
    novelty = {"similarity": similarity, "nearest": "x", "embedding": embedding(degrees)}
    model = [
        StageReport(stage="review", ok=review, seconds=0.0, detail="x"),
        StageReport(
            stage="calibration",
            ok=0 < pass_rate < 1,
            seconds=0.0,
            detail="x",
            data={**calibration, "difficulty": 1},
        ),
        StageReport(stage="novelty", ok=similarity < 0.8, seconds=0.0, detail="x", data=novelty),
    ]
    return combine(passed, model)


def source(name: str) -> str:
    """A distinct file per candidate (the archive keys candidates by their file)."""
    return EXAMPLE.replace("grid_shortest_path", name)


def context(redis_url: str, folder: Path, run: str = RUN) -> WorkerContext:
    ctx = WorkerContext(Settings(redis_url=redis_url, data_dir=folder, run=run))
    seed_pool(ctx.archive(), SEEDS)
    return ctx


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> WorkerContext:
    return context(redis_url, tmp_path)


def finish(
    ctx: WorkerContext, members: list[tuple[str, ValidationReport]], group_id: str = "g1"
) -> GradedGroup:
    """Each candidate's admission ends as `verdict.join_group` ends it; the last one
    completes the group, which `finalize_group` judges."""
    run = ctx.settings.run
    meta = {"prompt": "p", "parents": [], "completions": [{"text": s} for s, _ in members]}
    open_group(ctx, run, group_id, len(members), meta)
    tracker = GroupTracker(ctx.redis(), run)
    for index, (text, report) in enumerate(members):
        ctx.archive().record_validation(
            f"{group_id}-{index}", source_sha(text), report, adhoc=False
        )
        member = {"report": report.model_dump(mode="json"), "sha": source_sha(text), "source": text}
        tracker.finish(generation_key(group_id), str(index), member)
    return finalize_group(ctx, run, group_id)


def rewards(group: GradedGroup) -> list[float]:
    values = [c.reward for c in group.completions]
    assert all(v is not None for v in values)
    return [float(v) for v in values if v is not None]


def advantages(group: GradedGroup) -> list[float]:
    found = group_advantages(rewards(group), "generator", GrpoSettings())
    assert found is not None, "the group has no reward spread"
    return [float(a) for a in found]


COPY = judged("grid_shortest_path", similarity=1.0)
"""A verbatim copy of the example as admission reports it: every stage passes but novelty
(the very file of a pool member, similarity 1.0), calibrated at the example's pass rate."""


# ---------------------------------------------------------------- rewards, through the advantage


def test_an_invention_outranks_a_miscalibrated_file_a_copy_and_a_failure(
    ctx: WorkerContext,
) -> None:
    group = finish(
        ctx,
        [
            (source("walk_a"), judged("walk_a", similarity=0.3, degrees=0)),
            (source("walk_b"), judged("walk_b", pass_rate=0.0, similarity=0.3, degrees=90)),
            (EXAMPLE, COPY),
            (source("walk_d"), judged("walk_d", failed="L2")),
        ],
    )
    assert group.data.funnel == ["admitted", "calibration", "novelty", "L2"]
    new, miscalibrated, copy, failure = advantages(group)
    assert new > miscalibrated > copy > failure
    assert copy < 0
    assert rewards(group)[2:] == [-0.5, -0.9]  # the copy earns exactly the L5 figure
    (recorded,) = ctx.archive().metrics(RUN, "generation")  # what the run report lists
    assert recorded.values["group_id"] == "g1"
    assert [(c["outcome"], c["reward"], c["case"]) for c in recorded.values["candidates"]] == [
        (outcome, reward, case)
        for outcome, reward, case in zip(
            group.data.funnel,
            rewards(group),
            ["new", "calibration", "too similar", "L2"],
            strict=True,
        )
    ]


def test_copies_of_the_example_earn_negative_advantages_beside_an_invention(
    ctx: WorkerContext,
) -> None:
    copy = judged("grid_shortest_path", pass_rate=0.375, similarity=1.0)  # Q near 1
    new = judged("walk_new", pass_rate=0.625, similarity=0.5, degrees=90)  # lower Q and B
    group = finish(ctx, [(EXAMPLE, copy), (EXAMPLE, copy), (EXAMPLE, copy), (source("w"), new)])
    assert group.data.funnel == ["novelty", "novelty", "novelty", "admitted"]
    *copies, invention = advantages(group)
    assert all(a < 0 for a in copies) and invention > 0


def test_a_group_of_different_early_failures_has_spread(ctx: WorkerContext) -> None:
    members = [
        (source(f"fail_{stage.lower()}"), judged(f"fail_{stage.lower()}", failed=stage))
        for stage in ("L1", "L2", "L3", "L4")
    ]
    group = finish(ctx, members)
    l1, l2, l3, l4 = advantages(group)  # None (skipped) without spread
    assert l1 < l2 < l3 < l4
    assert rewards(group) == [-1.0, -0.9, -0.8, -0.7]


def test_a_copy_rejected_at_review_or_calibration_still_earns_the_copy_figure(
    ctx: WorkerContext,
) -> None:
    """Its funnel outcome is the first stage it failed; its reward is a copy's."""
    members = [
        (EXAMPLE, judged("grid_shortest_path", review=False, similarity=1.0)),
        (EXAMPLE, judged("grid_shortest_path", pass_rate=1.0, similarity=1.0)),
        (source("near"), judged("near", review=False, similarity=0.85, degrees=45)),
    ]
    group = finish(ctx, members)
    assert group.data.funnel == ["review", "calibration", "review"]
    assert rewards(group) == [-0.5, -0.5, -0.5]


def test_flipping_a_review_verdict_changes_no_reward(redis_url: str, tmp_path: Path) -> None:
    """Each candidate's review flipped in turn, each variant in a fresh archive and run (so
    that neither the pool nor gamma's window carries over): every reward stays the same."""
    base: list[dict[str, Any]] = [
        {"name": "walk_a", "degrees": 0},
        {"name": "walk_b", "pass_rate": 1.0, "degrees": 90},
        {"name": "grid_shortest_path", "similarity": 1.0, "degrees": 180},
        {"name": "walk_d", "failed": "L5"},
    ]
    seen = []
    for variant in range(len(base) + 1):
        members = []
        for index, spec in enumerate(base):
            text = EXAMPLE if spec["name"] == "grid_shortest_path" else source(spec["name"])
            members.append((text, judged(**spec, review=index != variant)))
        ctx = context(redis_url, tmp_path / f"v{variant}", run=f"flip-{variant}")
        group = finish(ctx, members)
        seen.append(rewards(group))
        funnel = group.data.funnel
        if variant < 3:  # L1-L5 passed: its outcome is now review, its reward unchanged
            assert funnel[variant] == "review"
    assert all(r == seen[-1] for r in seen), seen


# ---------------------------------------------------------------- in-group novelty


def test_a_failed_sibling_blocks_no_later_candidate(ctx: WorkerContext) -> None:
    """Candidate 0 failed calibration, candidate 1 failed review: neither survives, so
    candidate 2, identical in embedding to both, is admitted and paid as new."""
    group = finish(
        ctx,
        [
            (source("walk_a"), judged("walk_a", pass_rate=0.0, degrees=10)),
            (source("walk_b"), judged("walk_b", review=False, degrees=10)),
            (source("walk_c"), judged("walk_c", degrees=10)),
        ],
    )
    assert group.data.funnel == ["calibration", "review", "admitted"]
    row = ctx.archive().environment(source_sha(source("walk_c")))
    assert row is not None and row.status == "admitted"
    assert row.stats.reward is not None and row.stats.reward.case == "new"


def test_a_sibling_rejected_as_a_copy_is_no_survivor(ctx: WorkerContext) -> None:
    """0 degrees survives; 30 degrees is too like it (cosine 0.87); 60 degrees is like the
    rejected one (0.87) but not the survivor (0.5): it is admitted."""
    group = finish(
        ctx,
        [
            (source("walk_a"), judged("walk_a", degrees=0)),
            (source("walk_b"), judged("walk_b", degrees=30)),
            (source("walk_c"), judged("walk_c", degrees=60)),
        ],
    )
    assert group.data.funnel == ["admitted", "novelty", "admitted"]
    assert rewards(group)[1] == -0.5
    report = ctx.archive().validation("g1-1")
    assert report is not None and "to candidate 0 of its generation group" in (
        report.stages[-1].detail
    )


# ---------------------------------------------------------------- the file as written


class Answers:
    """A model that answers a proposal with the given texts, one completion each."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def chat(self, messages: Any, sampling: Any) -> list[Completion]:
        return [
            Completion(
                text=text,
                prompt_token_ids=[1],
                token_ids=[2],
                logprobs=[-0.1],
                finish_reason="stop",
                policy_version=0,
                version_source="redis",
                server="http://model",
            )
            for text in self.texts
        ]

    def close(self) -> None:
        pass


def test_a_file_that_needed_repairs_earns_what_it_earns_as_written(ctx: WorkerContext) -> None:
    """Two answers that imitate their example: one drops the base class's import (L1 as
    written), one the example's helpers (L2 as written). Extraction would have repaired both
    (the seed again; the class with the example's helpers). Proposed, validated and finalised
    on the real path, each earns its stage's figure, and its report names what it lacked."""
    seed = (SEEDS / "knapsack_max_value.py").read_text()
    tree = ast.parse(seed)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert any(isinstance(n, ast.FunctionDef) for n in tree.body), "the seed has helpers"
    no_base = seed.replace("from shared.environment import Environment\n", "")
    no_helpers = "\n".join(ast.get_source_segment(seed, n) or "" for n in [*imports, cls]) + "\n"
    messages = proposal_messages([Example("knapsack_max_value", "equality", seed, "x")])
    answers = [f"Here it is:\n```python\n{text}```" for text in (no_base, no_helpers)]
    prompt = prompt_text(messages)
    assert all(repairs(answer, prompt) for answer in answers)
    assert check_static(repaired_code(answers[0], prompt).encode(), 64 * 1024).ok
    ctx._inference = Answers(answers)  # type: ignore[assignment]
    job = ProposalJob(
        run=RUN, group_id="g9", messages=messages, parents=[], group_size=2,
        temperature=0.7, max_tokens=8,
    )  # fmt: skip
    try:
        jobs = propose(ctx, job)
        assert [j.source for j in jobs] == [no_base, no_helpers]  # as written: nothing added
        for validate in jobs:
            after = after_mechanical(ctx, validate, validate_job(ctx, validate))
            assert isinstance(after, Concluded)
            tasks.finalize_completed(ctx, after.completed)
        ((_, fields),) = ctx.redis().xrange(f"evoenv:{RUN}:rollouts")
    finally:
        ctx.close()
    group = decode_entry(fields)
    assert group.data.funnel == ["L1", "L2"]
    assert rewards(group) == [-1.0, -0.9]
    l1, l2 = ctx.archive().validation("g9-0"), ctx.archive().validation("g9-1")
    assert l1 is not None and l2 is not None
    assert "from shared.environment import Environment" in l1.stages[-1].detail
    assert "(the example's helper)" in l2.stages[-1].detail
