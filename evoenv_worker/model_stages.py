"""The model stages of admission, each a plain function: semantic self-review, difficulty
calibration (sample -> complete -> grade) and novelty against the pool. `verdict.py` chains
them and records their results; `tasks.py` runs each as a job on its queue."""

from __future__ import annotations

import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_worker.grade import grade_op, grade_op_seconds, read_grades
from evoenv_worker.novelty import EnvEmbedding, novelty, similarity
from evoenv_worker.review import VERDICT_SCHEMA, parse_verdict, review_messages, summarise
from evoenv_worker.running_checks import canonical, instance_op
from evoenv_worker.second_solve import SecondSolve, second_solve
from shared.config import Settings
from shared.environment import TRAIN_SEEDS, build_prompt, extract_answer
from shared.errors import EvoEnvError
from shared.inference import Completion, InferenceClient, Sampling
from shared.messages import (
    CalibrationProbe,
    StageJob,
    StageReport,
    Trace,
)
from shared.rewards import quality

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.sandbox.host import Sandbox

log = structlog.get_logger(__name__)


def request_seed(settings: Settings, *parts: object) -> int | None:
    """A request's sampling seed derived from `admission.sampling_seed` and `parts` (the same
    on every machine and run); None when no seed is set."""
    base = settings.admission.sampling_seed
    if base is None:
        return None
    digest = hashlib.sha256(":".join(map(str, (base, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def review_stage(
    client: InferenceClient, job: StageJob, settings: Settings, sandbox: Sandbox | None = None
) -> StageReport:
    """K reviews with a structured verdict; any reject (or unreadable verdict) rejects, and so
    do fewer than K verdicts; with `admission.second_solves`, so does a candidate (a generated
    one, unless `second_solves_for` is `all`) none of whose second solves agrees with its
    `solve` (run in `sandbox`). A request that fails raises: the
    stage could not run (`error`)."""
    started = time.perf_counter()
    a = settings.admission
    sampling = Sampling(
        n=a.reviews,
        temperature=a.review_temperature,
        max_tokens=a.review_max_tokens,
        json_schema=VERDICT_SCHEMA,
        seed=request_seed(settings, "review", job.env.sha),
    )
    completions = client.chat(review_messages(job.env.source, job.trace), sampling)  # the reviewer
    verdicts = [parse_verdict(c.text) for c in completions]
    ok, detail = summarise(verdicts, a.reviews)
    data: dict[str, Any] = {
        "reviews": a.reviews,
        "verdicts": [{"accept": v.accept, "readable": v.readable, "bug": v.bug} for v in verdicts],
    }
    if a.second_solves and (job.generated or a.second_solves_for == "all"):
        second = second_solve_of(client, job, settings, sandbox)
        ok, detail = ok and second.ok, f"{detail}; {second.detail}"
        data["second_solve"] = second.data()
    return StageReport(
        stage="review",
        ok=ok,
        seconds=round(time.perf_counter() - started, 3),
        detail=detail,
        data=data,
    )


def second_solve_of(
    client: InferenceClient, job: StageJob, settings: Settings, sandbox: Sandbox | None
) -> SecondSolve:
    """The review's second solves of `job`'s candidate, at the review's temperature and length."""
    if sandbox is None:
        raise EvoEnvError("the second solve runs the written solves in a sandbox: none was given")
    a = settings.admission
    sampling = Sampling(
        n=a.second_solves,
        temperature=a.review_temperature,
        max_tokens=a.review_max_tokens,
        seed=request_seed(settings, "second_solve", job.env.sha),
    )
    lo = job.trace.difficulty if job.min_difficulty is None else job.min_difficulty
    hi = job.trace.difficulty if job.max_difficulty is None else job.max_difficulty
    source, filename = job.env.source, f"{job.env.name}.py"
    limit = settings.validation.max_source_bytes
    return second_solve(client, sandbox, source, filename, job.trace, sampling, (lo, hi), limit)


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
    from evoenv_worker.solver_completions import record

    if job.error:
        return job

    def answer(index: int, prompt: str) -> Completion:
        sampling = Sampling(
            n=1,
            temperature=settings.grpo.temperature,
            max_tokens=settings.grpo.max_tokens,
            seed=request_seed(settings, "calibration", job.env.sha, index),
        )
        return client.chat([{"role": "user", "content": prompt}], sampling)[0]

    with ThreadPoolExecutor(max_workers=min(8, len(job.prompts) or 1)) as pool:
        answers = list(pool.map(answer, range(len(job.prompts)), job.prompts))
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
    data = _figures(passes, m, job.difficulty, errors, settings)
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


def _figures(
    passes: int, m: int, difficulty: int, errors: int, settings: Settings
) -> dict[str, Any]:
    """A calibration report's data: a, its counts, the level and Q."""
    rate = passes / m if m else 0.0
    return {
        "pass_rate": rate,
        "passes": passes,
        "instances": m,
        "difficulty": difficulty,
        "env_errors": errors,
        "quality": round(quality(rate, settings.admission), 6),
    }


def calibration_seeds(settings: Settings, job_id: str, sha: str, salt: str = "") -> list[int]:
    """The m training seeds of one calibration: from the job id, or from `sampling_seed` and the
    source's hash when that is set; `salt` (the search's level and turn) makes each later
    calibration of the same candidate draw fresh ones."""
    fixed = settings.admission.sampling_seed
    base = f"calibration:{job_id}" if fixed is None else f"{fixed}:{sha}"
    rng = random.Random(base + (f":{salt}" if salt else ""))
    count = settings.admission.calibration_instances
    return [rng.randrange(TRAIN_SEEDS.start, TRAIN_SEEDS.stop) for _ in range(count)]


def calibration_next(
    job: StageJob, report: StageReport, settings: Settings
) -> tuple[StageJob | None, StageReport]:
    """After one calibration: the next one the search asks for (None when this one decides),
    and the stage's report once decided.

    With `admission.calibration_search` at 0 the first calibration decides, as in the paper.
    Otherwise a pass rate of 1 (0) at the calibration difficulty sends m fresh instances one
    level harder (easier), up to that many levels, never past the environment's range nor back
    to a level already tried. A level found inside (0, 1) is calibrated once more on m fresh
    instances, and only that calibration decides (no admission on the draws that chose the
    level): admitted, its figures are the report's. Otherwise the report is the calibration
    difficulty's, its a and Q unchanged; the levels tried are listed in its detail and data."""
    data = report.data
    if "passes" not in data or data.get("env_errors"):
        return None, _searched(job.probes, report)  # the environment failed: that decides
    passes, m = int(data["passes"]), int(data["instances"])
    probes = [*job.probes, CalibrationProbe(difficulty=job.difficulty, passes=passes, instances=m)]
    inside = 0 < passes < m
    if job.confirm or (inside and not job.probes):
        return None, _searched(job.probes, report) if inside else _first(probes, settings)
    if inside:
        return _fresh(job, job.difficulty, probes, settings, confirm=True), report
    level = job.difficulty + (1 if passes == m else -1)
    lo = job.difficulty if job.min_difficulty is None else job.min_difficulty
    hi = job.difficulty if job.max_difficulty is None else job.max_difficulty
    searching = len(job.probes) < settings.admission.calibration_search
    if searching and lo <= level <= hi and level not in {p.difficulty for p in probes}:
        return _fresh(job, level, probes, settings, confirm=False), report
    return None, _first(probes, settings) if len(probes) > 1 else report


def _fresh(
    job: StageJob, level: int, probes: list[CalibrationProbe], settings: Settings, confirm: bool
) -> StageJob:
    salt = f"{len(probes)}:{level}"
    return job.model_copy(
        update={
            "difficulty": level,
            "seeds": calibration_seeds(settings, job.job_id, job.env.sha, salt),
            "prompts": [],
            "completions": [],
            "probes": probes,
            "confirm": confirm,
            "error": None,
        }
    )


def _levels(probes: list[CalibrationProbe]) -> str:
    return ", ".join(f"{p.passes}/{p.instances} at {p.difficulty}" for p in probes)


def _searched(probes: list[CalibrationProbe], report: StageReport) -> StageReport:
    """`report` (the deciding calibration) with the levels the search tried before it."""
    if not probes:
        return report
    data = {**report.data, "search": [p.model_dump() for p in probes]}
    detail = f"{report.detail} (the search tried {_levels(probes)} first)"
    return report.model_copy(update={"data": data, "detail": detail})


def _first(probes: list[CalibrationProbe], settings: Settings) -> StageReport:
    """The calibration difficulty's report, after a search that found no level inside (0, 1)
    (or whose fresh calibration there did not confirm it)."""
    first = probes[0]
    verdict = "always solved: too easy" if first.passes == first.instances else "never solved"
    data = _figures(first.passes, first.instances, first.difficulty, 0, settings)
    return StageReport(
        stage="calibration",
        ok=False,
        seconds=0.0,  # type: ignore[arg-type]
        data={**data, "search": [p.model_dump() for p in probes[1:]]},
        detail=(
            f"pass rate {first.passes}/{first.instances} at difficulty {first.difficulty}: "
            f"{verdict}; no level inside (0, 1) after the search: {_levels(probes[1:])}"
        ),
    )


@dataclass(frozen=True, slots=True)
class Member:
    """An active pool member as the novelty stage compares with it."""

    name: str
    sha: str
    source: str
    embedding: EnvEmbedding


def pool_members(ctx: WorkerContext) -> list[Member]:
    """Every active pool member with its embedding; missing ones are computed and stored."""
    archive, embedder = ctx.archive(), ctx.embedder()
    out: list[Member] = []
    for row in archive.environments("seed") + archive.environments("admitted"):
        embedding = EnvEmbedding.from_json(row.embedding)
        if embedding is None:
            traced = trace_instance(ctx.sandbox(), row.source, f"{row.name}.py")
            if traced is None:
                continue
            embedding = embedder.embed_environment(row.source, traced[1].prompt)
            archive.update_environment(row.sha, embedding=embedding.to_json())
        out.append(Member(row.name, row.sha, row.source, embedding))
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
    happens when their group completes), and whether the candidate's reference is that of one
    of its nearest members (`same_oracle`): either makes it a near-copy."""
    started = time.perf_counter()
    a = ctx.settings.admission
    embedding = ctx.embedder().embed_environment(job.env.source, job.trace.prompt)
    members = pool_members(ctx)
    result = novelty(
        embedding, [m.embedding for m in members], (), a.novelty_gate, a.novelty_prompt_weight
    )
    nearest = members[result.index].name if result.index is not None else None
    data: dict[str, Any] = {"similarity": result.similarity, "nearest": nearest}
    same = next((k for k, m in enumerate(members) if m.sha == job.env.sha), None)
    copied = None if same is not None else same_oracle(ctx, job, embedding, members)
    if same is not None:  # the very file of a pool member (a generator copying its example)
        result = replace(result, similarity=1.0, passes=False, nearest="pool", index=same)
        data.update(similarity=1.0, nearest=members[same].name)
        detail = f"the file is {members[same].name}, already in the pool: nothing new"
    elif copied is not None:  # a member's oracle under another prompt
        member, checked = copied
        detail = (
            f"its reference equals {member}'s on each of {checked} instances (seeds 0-"
            f"{checked - 1}, difficulty {job.trace.difficulty}): {member}'s solve under "
            f"another prompt (max embedding similarity {result.similarity:.3f})"
        )
        result = replace(result, similarity=1.0, passes=False)
        data.update(similarity=1.0, nearest=member, same_oracle=member)
    else:
        detail = (
            f"max similarity {result.similarity:.3f} to {nearest or 'nothing'} "
            f"({'below' if result.passes else 'at or above'} the gate {a.novelty_gate})"
        )
    data["embedding"] = embedding.to_json()
    return StageReport(
        stage="novelty",
        ok=result.passes,
        seconds=round(time.perf_counter() - started, 3),
        detail=detail,
        data=data,
    )


def same_oracle(
    ctx: WorkerContext, job: StageJob, embedding: EnvEmbedding, members: list[Member]
) -> tuple[str, int] | None:
    """(member, instances) when the candidate's solve agrees with a pool member's on every one
    of its own instances, else None.

    The embeddings compare how files read; a file that keeps its example's `solve` under a new
    question reads new (the example's problem with another question pasted into its prompt, or
    a new task's prompt over the example's code), and the reviewer may not see that the
    reference answers another question than the prompt asks. So the candidate's instances
    (seeds 0 to `same_oracle_instances` - 1 at the traced difficulty) go to the solve of each
    of its `same_oracle_members` nearest members, in the sandbox. Agreement on all of them, by
    reference or by answer text, makes it that member's oracle; a member whose solve fails on
    them (another instance shape) is not. 0 members turns the check off."""
    a = ctx.settings.admission
    if a.same_oracle_members <= 0 or a.same_oracle_instances <= 0:
        return None
    sandbox = ctx.sandbox()
    ops = [instance_op(seed, job.trace.difficulty) for seed in range(a.same_oracle_instances)]
    mine = sandbox.run(job.env.source, ops, filename=f"{job.env.name}.py")
    if not all(r.ok for r in mine):
        return None
    nearest = sorted(
        members,
        key=lambda m: similarity(embedding, m.embedding, a.novelty_prompt_weight),
        reverse=True,
    )
    for member in nearest[: a.same_oracle_members]:
        theirs = sandbox.run(
            member.source,
            [{"op": "solve", "instance": r.value["instance"]} for r in mine],
            filename=f"{member.name}.py",
            op_seconds=a.same_oracle_seconds,
        )
        if all(t.ok and _agree(m.value, t.value) for m, t in zip(mine, theirs, strict=True)):
            return member.name, len(mine)
    return None


def _agree(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """The same reference (as JSON) or the same answer text."""
    if canonical(mine["reference"]) == canonical(theirs["reference"]):
        return True
    return str(mine["answer_text"]).strip() == str(theirs["answer_text"]).strip()
