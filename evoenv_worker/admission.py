"""Admission after L1-L5: review, calibration and novelty as jobs, then the verdict and the
generator's reward. Plain functions; `tasks.py` turns what they return into jobs.

The flow of one candidate that passed L1-L5 (`begin`): its job and L-report are stored in
Redis and a candidate record opened with three members (review, calibration, novelty). The
stage jobs run on their queues: review on `generation`; calibration as sample (`grading`) ->
complete (`generation`) -> grade (`grading`); novelty on `validation`. Each stage finishes its
member (`finish_stage`); the one that completes the record finalises the candidate: the full
report is stored, an ad-hoc `pool add` is admitted, and a generated candidate finishes its
member of the generation group. All three model stages always run, even after one rejects,
because the generator's reward needs calibration and novelty.

The generation group (`finalize_group`, run by whoever completes it) compares candidates with
the earlier ones of the group in candidate order, computes gamma and every reward, records
each candidate in the archive (admitted or rejected, with its parents) and appends the group
to the rollout stream as a generator-role group.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_worker.grade import grade_op, grade_op_seconds, read_grades
from evoenv_worker.review import VERDICT_SCHEMA, parse_verdict, review_messages, summarise
from shared import keys
from shared.config import Settings
from shared.db import source_sha
from shared.environment import TRAIN_SEEDS, build_prompt, extract_answer
from shared.groups import GroupTracker
from shared.inference import InferenceClient, Sampling
from shared.messages import (
    MODEL_STAGES,
    CandidateRef,
    EnvRef,
    GradedCompletion,
    GradedGroup,
    ProposalJob,
    StageJob,
    StageReport,
    Trace,
    ValidateJob,
    ValidationReport,
)
from shared.rewards import generator_reward, mean_pairwise_similarity
from shared.rollouts import append_group

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.sandbox.host import Sandbox

log = structlog.get_logger(__name__)

KEEP_SECONDS = 7 * 24 * 3600


def candidate_key(job_id: str) -> str:
    return f"cand:{job_id}"


def generation_key(group_id: str) -> str:
    return f"gen:{group_id}"


def run_of(job: ValidateJob, settings: Settings) -> str:
    return job.candidate.run if job.candidate else settings.run


# ------------------------------------------------------------------------------ starting


def after_mechanical(
    ctx: WorkerContext, job: ValidateJob, report: ValidationReport
) -> StageJob | None:
    """What follows L1-L5: the model stages (returns their job), or the conclusion."""
    if job.model_stages and report.verdict == "admitted":
        stage_job = begin(ctx, job, report)
        if stage_job is not None:
            return stage_job
    conclude(ctx, job, report)
    return None


def propose(ctx: WorkerContext, job: ProposalJob) -> list[ValidateJob]:
    """Sample G candidates; open their generation group; one validation job per candidate."""
    from evoenv_worker.generate import record
    from evoenv_worker.propose import extract_code

    sampling = Sampling(n=job.group_size, temperature=job.temperature, max_tokens=job.max_tokens)
    completions = [record(c) for c in ctx.inference().chat(job.messages, sampling)]
    prompt = "\n\n".join(m["content"] for m in job.messages)
    open_group(
        ctx,
        job.run,
        job.group_id,
        len(completions),
        {
            "prompt": prompt,
            "parents": job.parents,
            "run": job.run,
            "completions": [c.model_dump(mode="json") for c in completions],
        },
    )
    jobs = []
    for index, completion in enumerate(completions):
        ref = CandidateRef(
            run=job.run,
            group_id=job.group_id,
            index=index,
            prompt=prompt,
            completion=completion,
            parents=job.parents,
        )
        jobs.append(
            ValidateJob(
                job_id=f"{job.group_id}-{index}",
                file=f"candidate_{job.group_id}_{index}.py",
                source=extract_code(completion.text),
                adhoc=False,
                model_stages=True,
                candidate=ref,
            )
        )
    return jobs


def begin(ctx: WorkerContext, job: ValidateJob, report: ValidationReport) -> StageJob | None:
    """After L1-L5 passed: store the candidate, open its record, and return the stage job to
    send to review, calibration and novelty (None if the trace instance cannot be sampled)."""
    stage_job = stage_job_for(ctx, job)
    if stage_job is None:
        return None
    client = ctx.redis()
    client.set(
        keys.candidate(stage_job.run, job.job_id),
        json.dumps({"job": job.model_dump(mode="json"), "report": report.model_dump(mode="json")}),
        ex=KEEP_SECONDS,
    )
    GroupTracker(client, stage_job.run).open(
        candidate_key(job.job_id), list(MODEL_STAGES), ctx.settings.admission.group_deadline
    )
    return stage_job


def stage_job_for(ctx: WorkerContext, job: ValidateJob) -> StageJob | None:
    """The model stages' job: the calibration difficulty and seeds, and the traced instance
    (seed 0, the middle difficulty) from the sandbox; None if it cannot be sampled."""
    settings = ctx.settings
    run = run_of(job, settings)
    meta = ctx.sandbox().run(job.source, [{"op": "describe"}], filename=job.file)[0]
    lo, hi = int(meta.value["min_difficulty"]), int(meta.value["max_difficulty"])
    difficulty = settings.admission.calibration_difficulty
    difficulty = (lo + hi) // 2 if difficulty is None else min(max(difficulty, lo), hi)
    (trace,) = ctx.sandbox().run(
        job.source, [{"op": "instance", "seed": 0, "difficulty": (lo + hi) // 2}], filename=job.file
    )
    if not trace.ok:
        return None
    rng = random.Random(f"calibration:{job.job_id}")
    seeds = [
        rng.randrange(TRAIN_SEEDS.start, TRAIN_SEEDS.stop)
        for _ in range(settings.admission.calibration_instances)
    ]
    env = EnvRef(name=str(meta.value["name"]), sha=source_sha(job.source), source=job.source)
    return StageJob(
        job_id=job.job_id,
        run=run,
        env=env,
        oracle=str(meta.value["oracle"]),
        difficulty=difficulty,
        trace=Trace(
            seed=0,
            difficulty=(lo + hi) // 2,
            prompt=build_prompt(trace.value["prompt"]),
            reference=trace.value["reference"],
            answer_text=trace.value["answer_text"],
        ),
        seeds=seeds,
    )


# ------------------------------------------------------------------------------ the stages


def review_stage(client: InferenceClient, job: StageJob, settings: Settings) -> StageReport:
    """K reviews with a structured verdict; any reject (or unreadable verdict) rejects."""
    started = time.perf_counter()
    a = settings.admission
    sampling = Sampling(
        n=a.reviews,
        temperature=a.review_temperature,
        max_tokens=a.review_max_tokens,
        json_schema=VERDICT_SCHEMA,
    )
    completions = client.chat(review_messages(job.env.source, job.trace), sampling)  # the reviewer
    verdicts = [parse_verdict(c.text) for c in completions]
    ok, detail = summarise(verdicts)
    data = {
        "verdicts": [{"accept": v.accept, "readable": v.readable, "bug": v.bug} for v in verdicts]
    }
    return StageReport(
        stage="review",
        ok=ok,
        seconds=round(time.perf_counter() - started, 3),
        detail=detail,
        data=data,
    )


def calibration_sample(sandbox: Sandbox, job: StageJob) -> StageJob:
    """The m fresh instances' prompts at the calibration difficulty."""
    ops = [{"op": "instance", "seed": seed, "difficulty": job.difficulty} for seed in job.seeds]
    results = sandbox.run(job.env.source, ops, filename=f"{job.env.name}.py")
    failed = next((r for r in results if not r.ok), None)
    if failed is not None:
        return job.model_copy(update={"error": f"sampling failed: {failed.reason}"})
    return job.model_copy(update={"prompts": [build_prompt(r.value["prompt"]) for r in results]})


def calibration_complete(client: InferenceClient, job: StageJob, settings: Settings) -> StageJob:
    """One answer per instance from the current solver, at its training temperature."""
    from evoenv_worker.generate import record

    if job.error:
        return job
    sampling = Sampling(
        n=1, temperature=settings.grpo.temperature, max_tokens=settings.grpo.max_tokens
    )
    with ThreadPoolExecutor(max_workers=min(8, len(job.prompts) or 1)) as pool:
        answers = list(
            pool.map(
                lambda p: client.chat([{"role": "user", "content": p}], sampling)[0], job.prompts
            )
        )
    return job.model_copy(update={"completions": [record(c) for c in answers]})


def calibration_stage(sandbox: Sandbox, job: StageJob, settings: Settings) -> StageReport:
    """Pass rate a of the solver (a pass is a score of exactly 1.0); admitted if 0 < a < 1."""
    started = time.perf_counter()
    if job.error:
        return StageReport(stage="calibration", ok=False, seconds=0.0, detail=job.error)
    cap = settings.validation.answer_cap
    answers = [extract_answer(completion.text, cap).answer for completion in job.completions]
    ops = [
        grade_op(seed, job.difficulty, [answer])
        for seed, answer in zip(job.seeds, answers, strict=True)
    ]
    results = sandbox.run(
        job.env.source,
        ops,
        filename=f"{job.env.name}.py",
        op_seconds=grade_op_seconds(settings, 1),
    )
    passes = errors = 0
    for answer, result in zip(answers, results, strict=True):
        if answer is None:
            continue  # format error: a fail
        grades, _ = read_grades(result, [answer])
        grade = grades[0] if grades else None
        if grade is None or grade.reward is None:
            errors += 1
        elif grade.reward == 1.0:
            passes += 1
    m = len(job.completions)
    rate = passes / m if m else 0.0
    data = {
        "pass_rate": rate,
        "passes": passes,
        "instances": m,
        "difficulty": job.difficulty,
        "env_errors": errors,
    }
    seconds = round(time.perf_counter() - started, 3)
    if errors:
        return StageReport(
            stage="calibration",
            ok=False,
            seconds=seconds,
            data=data,
            detail=f"the scorer failed on {errors} of {m} solver answers",
        )
    ok = 0 < passes < m
    verdict = (
        "within (0, 1)"
        if ok
        else ("always solved: too easy" if passes == m else "never solved: too hard")
    )
    return StageReport(
        stage="calibration",
        ok=ok,
        seconds=seconds,
        data=data,
        detail=f"pass rate {passes}/{m} at difficulty {job.difficulty}: {verdict}",
    )


def pool_embeddings(ctx: WorkerContext, exclude_sha: str) -> list[tuple[str, Any]]:
    """(name, embedding) of every active pool member; missing ones are computed and stored."""
    from evoenv_worker.novelty import EnvEmbedding

    archive, embedder = ctx.archive(), ctx.embedder()
    out: list[tuple[str, Any]] = []
    for row in archive.environments("seed") + archive.environments("admitted"):
        if row.sha == exclude_sha:
            continue  # the same file is not a copy of itself
        embedding = EnvEmbedding.from_json(row.embedding)
        if embedding is None:
            prompt = _trace_prompt(ctx.sandbox(), row.source, row.name)
            if prompt is None:
                continue
            embedding = embedder.embed_environment(row.source, prompt)
            archive.update_environment(row.sha, embedding=embedding.to_json())
        out.append((row.name, embedding))
    return out


def _trace_prompt(sandbox: Sandbox, source: str, name: str) -> str | None:
    """The rendered prompt at seed 0 and the middle difficulty (what novelty compares)."""
    (meta,) = sandbox.run(source, [{"op": "describe"}], filename=f"{name}.py")
    if not meta.ok:
        return None
    middle = (int(meta.value["min_difficulty"]) + int(meta.value["max_difficulty"])) // 2
    (result,) = sandbox.run(
        source, [{"op": "instance", "seed": 0, "difficulty": middle}], filename=f"{name}.py"
    )
    return build_prompt(result.value["prompt"]) if result.ok else None


def novelty_stage(ctx: WorkerContext, job: StageJob) -> StageReport:
    """Similarity to the nearest pool member (the in-group comparison of generated candidates
    happens when their group completes)."""
    from evoenv_worker.novelty import novelty

    started = time.perf_counter()
    a = ctx.settings.admission
    embedding = ctx.embedder().embed_environment(job.env.source, job.trace.prompt)
    members = pool_embeddings(ctx, job.env.sha)
    result = novelty(
        embedding, [e for _, e in members], (), a.novelty_gate, a.novelty_prompt_weight
    )
    nearest = members[result.index][0] if result.index is not None else None
    detail = (
        f"max similarity {result.similarity:.3f} to {nearest or 'nothing'} "
        f"({'below' if result.passes else 'at or above'} the gate {a.novelty_gate})"
    )
    return StageReport(
        stage="novelty",
        ok=result.passes,
        seconds=round(time.perf_counter() - started, 3),
        detail=detail,
        data={
            "similarity": result.similarity,
            "nearest": nearest,
            "embedding": embedding.to_json(),
        },
    )


# ------------------------------------------------------------------------------ finishing


def finish_stage(ctx: WorkerContext, job: StageJob, report: StageReport) -> None:
    """Record one model stage; the call that completes the candidate finalises it."""
    tracker = GroupTracker(ctx.redis(), job.run)
    if tracker.finish(candidate_key(job.job_id), report.stage, report.model_dump(mode="json")):
        finalize_candidate(ctx, job.run, job.job_id)


def finalize_candidate(ctx: WorkerContext, run: str, job_id: str) -> ValidationReport:
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
    return conclude(ctx, job, report)


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
    from shared.errors import EvoEnvError

    stage_job = stage_job_for(ctx, job)
    reports: list[StageReport] = []
    for stage in wanted:
        try:
            if stage_job is None:
                raise EvoEnvError("the traced instance could not be sampled")
            if stage == "review":
                reports.append(review_stage(ctx.reviewer(), stage_job, ctx.settings))
            elif stage == "calibration":
                sampled = calibration_sample(ctx.sandbox(), stage_job)
                answered = calibration_complete(ctx.inference(), sampled, ctx.settings)
                reports.append(calibration_stage(ctx.sandbox(), answered, ctx.settings))
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


def conclude(ctx: WorkerContext, job: ValidateJob, report: ValidationReport) -> ValidationReport:
    """Store the final report; admit a `pool add`; hand a generated candidate to its group."""
    client, archive = ctx.redis(), ctx.archive()
    sha = source_sha(job.source)
    public = report.model_copy(update={"stages": [_without_embedding(s) for s in report.stages]})
    client.set(keys.final_report(job.job_id), public.model_dump_json(), ex=KEEP_SECONDS)
    if report.verdict != "error":
        archive.record_validation(job.job_id, sha, public, adhoc=job.adhoc)
    if job.add_to_pool and report.verdict == "admitted" and report.name:
        archive.add_environment(report.name, job.source, status="candidate", origin="user")
        archive.update_environment(
            sha, status="admitted", stats=_admission_stats(report), embedding=_embedding_of(report)
        )
        log.info("env_admitted", env=report.name, env_sha=sha, origin="user")
    if job.candidate is not None:
        member = {"report": report.model_dump(mode="json"), "sha": sha, "source": job.source}
        tracker = GroupTracker(client, job.candidate.run)
        if tracker.finish(generation_key(job.candidate.group_id), str(job.candidate.index), member):
            finalize_group(ctx, job.candidate.run, job.candidate.group_id)
    return public


def _without_embedding(stage: StageReport) -> StageReport:
    if "embedding" not in stage.data:
        return stage
    return stage.model_copy(
        update={"data": {k: v for k, v in stage.data.items() if k != "embedding"}}
    )


def _embedding_of(report: ValidationReport) -> dict[str, Any] | None:
    for stage in report.stages:
        if stage.stage == "novelty" and isinstance(stage.data.get("embedding"), dict):
            return dict(stage.data["embedding"])
    return None


def _admission_stats(report: ValidationReport) -> dict[str, Any]:
    stats: dict[str, Any] = {"admitted_at": time.time()}
    for stage in report.stages:
        if stage.stage == "calibration":
            stats["calibration"] = stage.data
            if "difficulty" in stage.data:
                stats["calibration_difficulty"] = stage.data["difficulty"]
        elif stage.stage == "novelty":
            stats["novelty"] = {k: v for k, v in stage.data.items() if k != "embedding"}
    return stats


# ------------------------------------------------------------------------------ generation


def open_group(
    ctx: WorkerContext, run: str, group_id: str, size: int, meta: dict[str, Any]
) -> None:
    """A generation group of `size` candidates; `meta` (prompt, parents) is kept with it."""
    client = ctx.redis()
    client.set(keys.candidate(run, generation_key(group_id)), json.dumps(meta), ex=KEEP_SECONDS)
    GroupTracker(client, run).open(
        generation_key(group_id),
        [str(i) for i in range(size)],
        ctx.settings.admission.group_deadline,
    )


def finalize_group(ctx: WorkerContext, run: str, group_id: str) -> GradedGroup:
    """Every candidate of a generation group is done: in-group novelty in candidate order,
    gamma, the rewards, the archive, and one generator group on the rollout stream."""
    from evoenv_worker.novelty import EnvEmbedding, similarity

    settings, client = ctx.settings, ctx.redis()
    a = settings.admission
    meta = json.loads(client.get(keys.candidate(run, generation_key(group_id))) or "{}")
    members = GroupTracker(client, run).results(generation_key(group_id))
    ordered = sorted(members.items(), key=lambda item: int(item[0]))
    earlier: list[EnvEmbedding] = []
    rows: list[dict[str, Any]] = []
    for _, member in ordered:
        report = (
            ValidationReport.model_validate(member["report"])
            if member and "report" in member
            else None
        )
        stages = {s.stage: s for s in report.stages} if report else {}
        embedding = EnvEmbedding.from_json(_embedding_of(report)) if report else None
        in_group = (
            max((similarity(embedding, e, a.novelty_prompt_weight) for e in earlier), default=0.0)
            if embedding
            else 0.0
        )
        if embedding is not None:
            earlier.append(embedding)
        pool_similarity = stages["novelty"].data.get("similarity") if "novelty" in stages else None
        s = None if pool_similarity is None else max(float(pool_similarity), in_group)
        failed = report.failed_stage if report else "error"
        if report is not None and report.verdict == "error":
            failed = "error"  # the check could not run: no reward either way
        if failed is None and s is not None and s >= a.novelty_gate:
            failed = "novelty"
        rate = stages["calibration"].data.get("pass_rate") if "calibration" in stages else None
        rows.append(
            {
                "member": member or {},
                "report": report,
                "failed": failed,
                "similarity": s,
                "pass_rate": rate,
                "embedding": embedding,
            }
        )
    gamma = _gamma(
        client, run, [r["embedding"] for r in rows if r["embedding"] is not None], settings
    )
    completions: list[GradedCompletion] = []
    for index, row in enumerate(rows):
        completion = meta.get("completions", [{"text": ""}] * len(rows))[index]
        if row["failed"] == "error":
            completions.append(
                GradedCompletion(
                    **completion,
                    reward=None,
                    outcome="env_error",
                    detail="the admission check could not run",
                )
            )
            continue
        parts = generator_reward(row["failed"], row["pass_rate"], row["similarity"], gamma, a)
        _record_candidate(ctx, row, meta, parts.model_dump())
        completions.append(
            GradedCompletion(
                **completion,
                reward=parts.total,
                outcome="scored",
                detail=row["failed"] or "admitted",
            )
        )
    versions = [c.policy_version for c in completions]
    group = GradedGroup(
        run=run,
        group_id=group_id,
        role="generator",
        env_name="(generator)",
        env_sha="",
        seed=0,
        difficulty=0,
        prompt=str(meta.get("prompt", "")),
        policy_version=min(versions, default=0),
        completions=completions,
        data={
            "funnel": [r["failed"] or "admitted" for r in rows],
            "gamma": gamma,
            "parents": meta.get("parents", []),
        },
    )
    append_group(client, group)
    log.info(
        "generation_group_done",
        group_id=group_id,
        funnel=group.data["funnel"],
        rewards=[c.reward for c in completions],
    )
    return group


def _gamma(client: Any, run: str, embeddings: list[Any], settings: Settings) -> float:
    """gamma from the mean in-group similarity of the last few generation groups."""
    from evoenv_worker.novelty import similarity
    from shared.rewards import gamma_for

    a = settings.admission
    matrix = [[similarity(x, y, a.novelty_prompt_weight) for y in embeddings] for x in embeddings]
    mean = mean_pairwise_similarity(matrix)
    key = keys.repetition(run)
    if mean is not None:
        client.lpush(key, mean)
        client.ltrim(key, 0, a.repetition_window - 1)
    values = [float(v) for v in client.lrange(key, 0, -1)]
    return gamma_for(sum(values) / len(values) if values else None, a)


def _record_candidate(
    ctx: WorkerContext, row: dict[str, Any], meta: dict[str, Any], reward: dict[str, Any]
) -> None:
    """The candidate in the archive: admitted only if every stage passed, with its lineage."""
    report: ValidationReport | None = row["report"]
    sha = row["member"].get("sha")
    if report is None or not sha or not report.name:
        return
    archive = ctx.archive()
    source = str(row["member"].get("source") or "")
    archive.add_environment(
        report.name, source, status="candidate", origin="generated", parents=meta.get("parents", [])
    )
    clash = archive.by_name(report.name)
    admitted = row["failed"] is None and (clash is None or clash.sha == sha)
    stats = {**_admission_stats(report), "reward": reward, "funnel": row["failed"] or "admitted"}
    if row["failed"] is None and not admitted:
        stats["funnel"] = "name clash"
    archive.update_environment(
        sha,
        status="admitted" if admitted else "rejected",
        stats=stats,
        embedding=row["embedding"].to_json() if row["embedding"] else None,
    )


STAGE_OF_TASK = {
    "evoenv.review": "review",
    "evoenv.calibrate_sample": "calibration",
    "evoenv.calibrate_complete": "calibration",
    "evoenv.calibrate_grade": "calibration",
    "evoenv.novelty": "novelty",
}


def job_failed(ctx: WorkerContext, task: str, payload: dict[str, Any], error: str) -> None:
    """A job of the admission flow failed for good (infrastructure): its stage is recorded as
    not run, so the candidate and its group still complete (the report says `error`)."""
    if task in STAGE_OF_TASK:
        try:
            job = StageJob.model_validate(payload)
        except ValueError:
            return
        report = StageReport(
            stage=STAGE_OF_TASK[task],
            ok=False,
            seconds=0.0,  # type: ignore[arg-type]
            detail=f"the stage could not run: {error}",
            data={"error": True},
        )
        finish_stage(ctx, job, report)
    elif task == "evoenv.validate":
        try:
            job_v = ValidateJob.model_validate(payload)
        except ValueError:
            return
        report_v = ValidationReport(
            file=job_v.file,
            name=None,
            verdict="error",
            failed_stage=None,
            stages=[],
            error=f"the check could not run: {error}",
        )
        conclude(ctx, job_v, report_v)
