"""Admission after L1-L5: review, calibration and novelty as jobs, then the verdict.

Plain functions; `tasks.py` turns what they return into jobs. How one candidate flows, and why
`generation` uses `admission` and never the reverse: docs/DESIGN.md#generation-groups.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from shared import keys
from shared.config import Settings
from shared.db import source_sha
from shared.env_stats import CalibrationFigures, EnvStats, NoveltyFigures
from shared.groups import GroupTracker
from shared.messages import (
    MODEL_STAGES,
    EnvRef,
    StageJob,
    StageReport,
    ValidateJob,
    ValidationReport,
)

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext

log = structlog.get_logger(__name__)

KEEP_SECONDS = 7 * 24 * 3600


def candidate_key(job_id: str) -> str:
    return f"cand:{job_id}"


def generation_key(group_id: str) -> str:
    return f"gen:{group_id}"


def run_of(job: ValidateJob, settings: Settings) -> str:
    return job.candidate.run if job.candidate else settings.run


@dataclass(frozen=True, slots=True)
class CompletedGroup:
    """A generation group whose last candidate was just concluded: the caller finalises it
    (`generation.finalize_group`)."""

    run: str
    group_id: str


@dataclass(frozen=True, slots=True)
class Concluded:
    """A concluded candidate: its final report and the generation group it completed."""

    report: ValidationReport
    """The final report as stored (without embeddings)."""
    completed: CompletedGroup | None = None
    """The generation group this candidate was the last of (None: none, or not generated)."""


# ------------------------------------------------------------------------------ starting


def after_mechanical(
    ctx: WorkerContext, job: ValidateJob, report: ValidationReport
) -> StageJob | Concluded:
    """What follows L1-L5: the model stages (returns their job to send), or the conclusion
    (the generation group it completed, if any, is the caller's to finalise)."""
    if job.model_stages and report.verdict == "admitted":
        stage_job = begin(ctx, job, report)
        if stage_job is not None:
            return stage_job
    return conclude_job(ctx, job, with_repairs_named(job, report))


def with_repairs_named(job: ValidateJob, report: ValidationReport) -> ValidationReport:
    """A generated candidate that failed L1-L5, with its failing stage's detail naming what
    extraction would have completed (`proposal_code.repairs`: dropped imports, the example's
    helpers). The file was judged, and is rewarded, as written; this only says what it lacked.
    Any other report is returned as it is."""
    from evoenv_worker.proposal_code import repairs

    ref = job.candidate
    if ref is None or report.verdict != "rejected" or report.failed_stage is None:
        return report
    added = repairs(ref.completion.text, ref.prompt)
    if not added:
        return report
    note = f" (judged as written; it lacks what extraction would add: {'; '.join(added)})"
    stages = [
        stage.model_copy(update={"detail": stage.detail + note})
        if stage.stage == report.failed_stage
        else stage
        for stage in report.stages
    ]
    return report.model_copy(update={"stages": stages})


def begin(ctx: WorkerContext, job: ValidateJob, report: ValidationReport) -> StageJob | None:
    """After L1-L5 passed: store the candidate, open its record, and return the stage job to
    send to review, calibration and novelty (None if the trace instance cannot be sampled).

    The job and its L1-L5 report are stored in Redis, and the candidate's record has one member
    per model stage. All three stages always run, even after one rejects, because the
    generator's reward needs calibration and novelty figures.
    """
    stage_job = stage_job_for(ctx, job)
    if stage_job is None:
        return None
    client = ctx.redis()
    client.set(
        keys.candidate(stage_job.run, job.job_id),
        json.dumps({"job": job.model_dump(mode="json"), "report": report.model_dump(mode="json")}),
        ex=KEEP_SECONDS,
    )
    GroupTracker(client, stage_job.run).open(candidate_key(job.job_id), list(MODEL_STAGES))
    return stage_job


def stage_job_for(ctx: WorkerContext, job: ValidateJob) -> StageJob | None:
    """The model stages' job: the calibration difficulty and seeds, and the traced instance
    (seed 0, the middle difficulty) from the sandbox; None if it cannot be sampled."""
    settings = ctx.settings
    run = run_of(job, settings)
    from evoenv_worker.model_stages import calibration_seeds, trace_instance

    traced = trace_instance(ctx.sandbox(), job.source, job.file)
    if traced is None:
        return None
    meta, trace = traced
    lo, hi = int(meta["min_difficulty"]), int(meta["max_difficulty"])
    difficulty = settings.admission.calibration_difficulty
    difficulty = trace.difficulty if difficulty is None else min(max(difficulty, lo), hi)
    sha = source_sha(job.source)
    env = EnvRef(name=str(meta["name"]), sha=sha, source=job.source)
    return StageJob(
        job_id=job.job_id,
        run=run,
        env=env,
        oracle=str(meta["oracle"]),
        difficulty=difficulty,
        trace=trace,
        seeds=calibration_seeds(settings, job.job_id, sha),
        min_difficulty=lo,
        max_difficulty=hi,
        generated=job.candidate is not None,
    )


# ------------------------------------------------------------------------------ finishing


def finish_stage(ctx: WorkerContext, job: StageJob, report: StageReport) -> CompletedGroup | None:
    """Record one model stage; the call that completes the candidate finalises it. Returns the
    generation group that completed with it (the caller finalises that), if any."""
    tracker = GroupTracker(ctx.redis(), job.run)
    if tracker.finish(candidate_key(job.job_id), report.stage, report.model_dump(mode="json")):
        return finalize_candidate(ctx, job.run, job.job_id).completed
    return None


def finalize_candidate(ctx: WorkerContext, run: str, job_id: str) -> Concluded:
    """All stages of one candidate are done: the full report, then what follows from it."""
    client = ctx.redis()
    raw = client.get(keys.candidate(run, job_id))
    if raw is None:
        raise KeyError(f"candidate {job_id} of run {run} is not on record")
    stored = json.loads(raw)
    job = ValidateJob.model_validate(stored["job"])
    mechanical = ValidationReport.model_validate(stored["report"])
    results = GroupTracker(client, run).results(candidate_key(job_id))
    stages = list(mechanical.stages)
    for stage in MODEL_STAGES:
        result = results.get(stage)
        if result is None or "stage" not in result:
            error = (result or {}).get("error", "the stage did not finish")
            stages.append(StageReport(stage=stage, ok=False, seconds=0.0, detail=str(error)))
        else:
            stages.append(StageReport.model_validate(result))
    report = combine(mechanical, stages[len(mechanical.stages) :])
    return conclude_job(ctx, job, report)


def combine(mechanical: ValidationReport, model: list[StageReport]) -> ValidationReport:
    """The full report: L1-L5 then the model stages; `error` if a stage could not run."""
    stages = [*mechanical.stages, *model]
    failed = next((s.stage for s in stages if not s.ok), None)
    broken = [s for s in stages if s.data.get("error")]
    verdict = "error" if broken else ("rejected" if failed else "admitted")
    return mechanical.model_copy(
        update={
            "stages": stages,
            "verdict": verdict,
            "failed_stage": None if broken else failed,
            "error": broken[0].detail if broken else None,
        }
    )


def run_locally(
    ctx: WorkerContext, job: ValidateJob, mechanical: ValidationReport, wanted: list[str]
) -> ValidationReport:
    """The model stages in this process, one after the other (`evoenv validate --all`)."""
    from evoenv_worker.model_stages import novelty_stage, review_stage
    from shared.errors import EvoEnvError

    stage_job = stage_job_for(ctx, job)
    reports: list[StageReport] = []
    for stage in wanted:
        try:
            if stage_job is None:
                raise EvoEnvError("the traced instance could not be sampled")
            if stage == "review":
                sandbox = ctx.sandbox() if ctx.settings.admission.second_solves else None
                reports.append(review_stage(ctx.reviewer(), stage_job, ctx.settings, sandbox))
            elif stage == "calibration":
                reports.append(calibrate_locally(ctx, stage_job, ctx.settings))
            elif stage == "novelty":
                reports.append(novelty_stage(ctx, stage_job))
        except EvoEnvError as exc:
            reports.append(
                StageReport(
                    stage=stage,
                    ok=False,
                    seconds=0.0,  # type: ignore[arg-type]
                    detail=f"the stage could not run: {exc}",
                    data={"error": True},
                )
            )
    return combine(mechanical, reports)


def calibrate_locally(
    ctx: WorkerContext, job: StageJob, settings: Settings, found: StageReport | None = None
) -> StageReport:
    """Calibration in this process, the calibration search's levels included (`settings`);
    `found`: the calibration difficulty's report, when that calibration already ran."""
    from evoenv_worker.model_stages import (
        calibration_complete,
        calibration_next,
        calibration_sample,
        calibration_stage,
    )

    following: StageJob | None = job
    if found is not None:
        following, found = calibration_next(job, found, settings)
    while following is not None:
        sampled = calibration_sample(ctx.sandbox(), following)
        answered = calibration_complete(ctx.inference(), sampled, settings)
        found = calibration_stage(ctx.sandbox(), answered, settings)
        following, found = calibration_next(following, found, settings)
    assert found is not None
    return found


def conclude_job(ctx: WorkerContext, job: ValidateJob, report: ValidationReport) -> Concluded:
    """The end of a job's admission: `conclude`, then a generated candidate joins its group."""
    return Concluded(conclude(ctx, job, report), join_group(ctx, job, report))


def conclude(
    ctx: WorkerContext, job: ValidateJob, report: ValidationReport, *, in_redis: bool = True
) -> ValidationReport:
    """Store the final report (in Redis too with `in_redis`, where `evoenv job` reads a queued
    job's); admit a `pool add`. A generated candidate's generation group is not touched here:
    the admission flow goes through `conclude_job`."""
    archive = ctx.archive()
    sha = source_sha(job.source)
    public = report.model_copy(update={"stages": [_without_embedding(s) for s in report.stages]})
    if in_redis:
        ctx.redis().set(keys.final_report(job.job_id), public.model_dump_json(), ex=KEEP_SECONDS)
    if report.verdict != "error":
        archive.record_validation(job.job_id, sha, public, adhoc=job.adhoc)
    if job.add_to_pool and report.verdict == "admitted" and report.name:
        archive.add_environment(report.name, job.source, status="candidate", origin="user")
        archive.update_environment(
            sha,
            status="admitted",
            stats=admission_stats(report, admitted=True),
            embedding=embedding_of(report),
        )
        log.info("env_admitted", env=report.name, env_sha=sha, origin="user")
    return public


def join_group(
    ctx: WorkerContext, job: ValidateJob, report: ValidationReport
) -> CompletedGroup | None:
    """A generated candidate finishes its member of its generation group (the full report,
    embeddings included); returns the group if this was its last member (None: others still
    run, or the candidate is not generated)."""
    ref = job.candidate
    if ref is None:
        return None
    member = {
        "report": report.model_dump(mode="json"),
        "sha": source_sha(job.source),
        "source": job.source,
    }
    tracker = GroupTracker(ctx.redis(), ref.run)
    if tracker.finish(generation_key(ref.group_id), str(ref.index), member):
        return CompletedGroup(ref.run, ref.group_id)
    return None


def _without_embedding(stage: StageReport) -> StageReport:
    if "embedding" not in stage.data:
        return stage
    return stage.model_copy(
        update={"data": {k: v for k, v in stage.data.items() if k != "embedding"}}
    )


def embedding_of(report: ValidationReport) -> dict[str, Any] | None:
    for stage in report.stages:
        if stage.stage == "novelty" and isinstance(stage.data.get("embedding"), dict):
            return dict(stage.data["embedding"])
    return None


def admission_stats(report: ValidationReport, *, admitted: bool) -> EnvStats:
    """What the archive keeps of a judged candidate's model stages; `admitted_at` only when
    it is `admitted` (reports count an environment as admitted by it)."""
    judged_at = time.time()
    stats = EnvStats(judged_at=judged_at)
    if admitted:
        stats.admitted_at = judged_at
    for stage in report.stages:
        if stage.stage == "calibration":
            stats.calibration = CalibrationFigures.model_validate(stage.data)
            if "difficulty" in stage.data:
                stats.calibration_difficulty = stage.data["difficulty"]
        elif stage.stage == "novelty":
            stats.novelty = NoveltyFigures.model_validate(
                {k: v for k, v in stage.data.items() if k != "embedding"}
            )
    return stats


STAGE_OF_TASK = {
    "evoenv.review": "review",
    "evoenv.calibrate_sample": "calibration",
    "evoenv.calibrate_complete": "calibration",
    "evoenv.calibrate_grade": "calibration",
    "evoenv.novelty": "novelty",
}


def job_failed(
    ctx: WorkerContext, task: str, payload: dict[str, Any], error: str
) -> CompletedGroup | None:
    """A job of the admission flow failed for good (infrastructure): its stage is recorded as
    not run, so the candidate and its group still complete (the report says `error`). Returns
    the generation group that completed with it (the caller finalises that), if any."""
    if task in STAGE_OF_TASK:
        try:
            job = StageJob.model_validate(payload)
        except ValueError:
            return None
        report = StageReport(
            stage=STAGE_OF_TASK[task],
            ok=False,
            seconds=0.0,  # type: ignore[arg-type]
            detail=f"the stage could not run: {error}",
            data={"error": True},
        )
        return finish_stage(ctx, job, report)
    if task == "evoenv.validate":
        try:
            job_v = ValidateJob.model_validate(payload)
        except ValueError:
            return None
        report_v = ValidationReport(
            file=job_v.file,
            name=None,
            verdict="error",
            failed_stage=None,
            stages=[],
            error=f"the check could not run: {error}",
        )
        return conclude_job(ctx, job_v, report_v).completed
    return None
