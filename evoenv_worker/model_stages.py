"""The model stages of admission, each a plain function: semantic self-review, difficulty
calibration (sample -> complete -> grade) and novelty against the pool. `admission.py` chains
them and records their results; `tasks.py` runs each as a job on its queue."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_worker.grade import grade_op, grade_op_seconds, read_grades
from evoenv_worker.review import VERDICT_SCHEMA, parse_verdict, review_messages, summarise
from shared.config import Settings
from shared.environment import build_prompt, extract_answer
from shared.inference import InferenceClient, Sampling
from shared.messages import (
    StageJob,
    StageReport,
    Trace,
)
from shared.rewards import quality

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.sandbox.host import Sandbox

log = structlog.get_logger(__name__)


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
    """Pass rate a of the solver (a pass is a score of exactly 1.0); admitted if 0 < a < 1.

    Its data also carries Q, the generator reward's calibration quality of a: computed at
    every a, 0 and 1 included (it bars admission but still says how far off the file was)."""
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
        "quality": round(quality(rate, settings.admission), 6),
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


def pool_embeddings(ctx: WorkerContext) -> list[tuple[str, str, Any]]:
    """(name, sha, embedding) of every active pool member; missing ones are computed and stored."""
    from evoenv_worker.novelty import EnvEmbedding

    archive, embedder = ctx.archive(), ctx.embedder()
    out: list[tuple[str, str, Any]] = []
    for row in archive.environments("seed") + archive.environments("admitted"):
        embedding = EnvEmbedding.from_json(row.embedding)
        if embedding is None:
            traced = trace_instance(ctx.sandbox(), row.source, f"{row.name}.py")
            if traced is None:
                continue
            embedding = embedder.embed_environment(row.source, traced[1].prompt)
            archive.update_environment(row.sha, embedding=embedding.to_json())
        out.append((row.name, row.sha, embedding))
    return out


def trace_instance(
    sandbox: Sandbox, source: str, filename: str
) -> tuple[dict[str, Any], Trace] | None:
    """The environment's class attributes and its traced instance: seed 0 at the middle
    difficulty (what the reviewer reads and novelty compares); None if either fails."""
    (meta,) = sandbox.run(source, [{"op": "describe"}], filename=filename)
    if not meta.ok:
        return None
    middle = (int(meta.value["min_difficulty"]) + int(meta.value["max_difficulty"])) // 2
    (result,) = sandbox.run(
        source, [{"op": "instance", "seed": 0, "difficulty": middle}], filename=filename
    )
    if not result.ok:
        return None
    value = result.value
    trace = Trace(
        seed=0,
        difficulty=middle,
        prompt=build_prompt(value["prompt"]),
        reference=value["reference"],
        answer_text=value["answer_text"],
    )
    return meta.value, trace


def novelty_stage(ctx: WorkerContext, job: StageJob) -> StageReport:
    """Similarity to the nearest pool member (the in-group comparison of generated candidates
    happens when their group completes)."""
    from evoenv_worker.novelty import novelty

    started = time.perf_counter()
    a = ctx.settings.admission
    embedding = ctx.embedder().embed_environment(job.env.source, job.trace.prompt)
    members = pool_embeddings(ctx)
    result = novelty(
        embedding, [e for _, _, e in members], (), a.novelty_gate, a.novelty_prompt_weight
    )
    nearest = members[result.index][0] if result.index is not None else None
    same = next((k for k, (_, sha, _) in enumerate(members) if sha == job.env.sha), None)
    if same is not None:  # the very file of a pool member (a generator copying its example)
        result = replace(result, similarity=1.0, passes=False, nearest="pool", index=same)
        nearest = members[same][0]
        detail = f"the file is {nearest}, already in the pool: nothing new"
    else:
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
