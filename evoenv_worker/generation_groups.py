"""Generation groups: sample G candidates, then, when every candidate's admission is done,
compare each with the earlier survivors of its group (in-group novelty), compute gamma and
every reward, record the candidates and the group in the archive and append the group to the
rollout stream (generator role). A group the learner stops waiting for is finalised as expired
instead (`expire_group`; docs/DESIGN.md#generation-groups)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

from evoenv_worker.novelty import EnvEmbedding, novelty, similarity
from evoenv_worker.repair_turns import turns_of
from evoenv_worker.verdict import KEEP_SECONDS, admission_stats, embedding_of, generation_key
from shared import keys
from shared.config import Settings
from shared.db import source_sha
from shared.groups import GroupTracker
from shared.inference import Sampling
from shared.messages import (
    CandidateRef,
    CompletionRecord,
    GeneratorGroupData,
    GradedCompletion,
    GradedGroup,
    ProposalJob,
    Stage,
    ValidateJob,
    ValidationReport,
)
from shared.rewards import (
    RepetitionTracker,
    RewardParts,
    generator_reward,
    mean_pairwise_similarity,
)
from shared.rollouts import append_group

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext

log = structlog.get_logger(__name__)


def propose(ctx: WorkerContext, job: ProposalJob) -> list[ValidateJob]:
    """Sample G candidates (a repair group: one repair per candidate of the group it repairs
    that failed L1-L5); open their generation group, its mode recorded; one validation job
    per candidate (none for a group the learner gave up on, expired before or while its
    proposal ran, nor for a repair group with nothing to repair)."""
    from evoenv_worker.proposal_code import prompt_text, written_code
    from shared.proposal_modes import own_task_of

    tracker = GroupTracker(ctx.redis(), job.run)
    if tracker.expired(generation_key(job.group_id)):
        log.info("proposal_skipped", group_id=job.group_id, detail="its group expired")
        return []
    asked = turns_of(ctx, job)
    if not asked.prompts:
        log.info("proposal_skipped", group_id=job.group_id, detail="nothing to repair")
        return []
    completions = _sample(ctx, job, asked.prompts)
    prompts = [prompt_text(messages) for messages in asked.prompts]
    meta: dict[str, Any] = {
        "prompt": prompts[0],
        "parents": asked.parents,
        "run": job.run,
        "completions": [c.model_dump(mode="json") for c in completions],
        "mode": job.mode,
        "messages": job.messages,
    }
    if job.mode == "repair":
        meta.update(repair_of=job.repair_of, repaired=asked.positions, prompts=prompts)
    if job.mode == "own_task":
        meta["tasks"] = [own_task_of(c.text) for c in completions]
    open_group(ctx, job.run, job.group_id, len(completions), meta)
    if tracker.expired(generation_key(job.group_id)):
        log.info("proposal_skipped", group_id=job.group_id, detail="its group expired meanwhile")
        return []
    jobs = []
    for index, completion in enumerate(completions):
        ref = CandidateRef(
            run=job.run,
            group_id=job.group_id,
            index=index,
            prompt=prompts[index],
            completion=completion,
            parents=asked.parents,
        )
        jobs.append(
            ValidateJob(
                job_id=f"{job.group_id}-{index}",
                file=f"candidate_{job.group_id}_{index}.py",
                source=written_code(completion.text),
                adhoc=False,
                model_stages=True,
                candidate=ref,
            )
        )
    return jobs


def _sample(
    ctx: WorkerContext, job: ProposalJob, prompts: list[list[dict[str, str]]]
) -> list[CompletionRecord]:
    """One completion per prompt; one request of n = G when they are all the same prompt,
    else one request each, all in flight together (the server batches them)."""
    from evoenv_worker.solver_completions import record

    client = ctx.inference()
    if all(p is prompts[0] for p in prompts):
        sampling = Sampling(n=len(prompts), temperature=job.temperature, max_tokens=job.max_tokens)
        return [record(c) for c in client.chat(prompts[0], sampling)]
    one = Sampling(n=1, temperature=job.temperature, max_tokens=job.max_tokens)
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        answers = list(pool.map(lambda messages: client.chat(messages, one), prompts))
    return [record(c) for answer in answers for c in answer]


def open_group(
    ctx: WorkerContext, run: str, group_id: str, size: int, meta: dict[str, Any]
) -> None:
    """A generation group of `size` candidates; `meta` (prompt, parents) is kept with it."""
    client = ctx.redis()
    client.set(keys.candidate(run, generation_key(group_id)), json.dumps(meta), ex=KEEP_SECONDS)
    GroupTracker(client, run).open(generation_key(group_id), [str(i) for i in range(size)])


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate of a generation group, as its group judged it."""

    position: str
    """Its index in the group (candidate order), as the group's record names it."""
    member: dict[str, Any]
    """What its admission left in the group's record: the full report, sha and source."""
    report: ValidationReport | None
    """Its full report (None: its admission left none)."""
    failed: Stage | Literal["error", "expired"] | None
    """The funnel outcome: the first stage it failed, "error", "expired", or None (admitted)."""
    embedding: EnvEmbedding | None = None
    known: str | None = None
    """The status of the archive's row of this very file, when that row is not a candidate's."""
    similarity: float | None = None
    """The novelty figure of its reward: max(pool, in-group); None if novelty produced none."""
    pass_rate: float | None = None


def finalize_group(ctx: WorkerContext, run: str, group_id: str) -> GradedGroup:
    """Every candidate of a generation group is done: in-group novelty in candidate order
    against the survivors, gamma, the rewards, the archive, and one generator group on the
    rollout stream."""
    settings, client = ctx.settings, ctx.redis()
    meta = json.loads(client.get(keys.candidate(run, generation_key(group_id))) or "{}")
    members = GroupTracker(client, run).results(generation_key(group_id))
    ordered = sorted(members.items(), key=lambda item: int(item[0]))
    rows = _judge_in_order(ctx, group_id, ordered)
    gamma = _gamma(client, run, [r.embedding for r in rows if r.embedding is not None], settings)
    default = [{"text": ""}] * len(rows)
    graded = [
        _graded(ctx, row, meta, meta.get("completions", default)[index], gamma)
        for index, row in enumerate(rows)
    ]
    completions = [completion for completion, _ in graded]
    group = _generator_group(run, group_id, meta, rows, completions, gamma)
    append_group(client, group, ctx.stream_key())
    _record_group(ctx, group, rows, [parts for _, parts in graded], gamma, meta)
    log.info(
        "generation_group_done",
        group_id=group_id,
        funnel=[r.failed or "admitted" for r in rows],
        rewards=[c.reward for c in completions],
        cases=[parts.case if parts else None for _, parts in graded],
    )
    return group


def _report_of(member: dict[str, Any] | None) -> ValidationReport | None:
    """The full report a candidate's admission left in its group's record, if any."""
    if member and "report" in member:
        return ValidationReport.model_validate(member["report"])
    return None


def _judge_in_order(
    ctx: WorkerContext, group_id: str, ordered: list[tuple[str, dict[str, Any] | None]]
) -> list[Candidate]:
    """Each candidate in candidate order, compared with the survivors before it: the earlier
    siblings that passed every other stage (L1-L5, review, calibration, pool novelty) and were
    not themselves rejected as too like a survivor or as a known file. A sibling that failed
    blocks nothing: every candidate of a group is asked for the same task."""
    a = ctx.settings.admission
    survivors: list[tuple[str, EnvEmbedding]] = []
    rows = []
    for position, member in ordered:
        report = _report_of(member)
        embedding = EnvEmbedding.from_json(embedding_of(report)) if report is not None else None
        nearest: tuple[float, str | None] = (0.0, None)
        if embedding is not None and survivors:
            earlier = [e for _, e in survivors]
            found = novelty(embedding, (), earlier, a.novelty_gate, a.novelty_prompt_weight)
            if found.index is not None:
                nearest = (found.similarity, survivors[found.index][0])
        row = _judge(ctx, group_id, position, member, report, embedding, nearest)
        if row.failed is None and embedding is not None:
            survivors.append((position, embedding))
        rows.append(row)
    return rows


def _judge(
    ctx: WorkerContext,
    group_id: str,
    position: str,
    member: dict[str, Any] | None,
    report: ValidationReport | None,
    embedding: EnvEmbedding | None,
    in_group: tuple[float, str | None],
) -> Candidate:
    """What the group decides of one candidate: its funnel outcome and reward figures.
    `in_group` is its largest similarity to an earlier survivor of its group and that one's
    position. A candidate whose report said admitted but that the group rejects at novelty
    (too like a survivor, or the very file of a known environment) has its stored report
    amended."""
    a = ctx.settings.admission
    similarity_in_group, nearest = in_group
    stages = {s.stage: s for s in report.stages} if report else {}
    pool_similarity = stages["novelty"].data.get("similarity") if "novelty" in stages else None
    s = None if pool_similarity is None else max(float(pool_similarity), similarity_in_group)
    failed = report.failed_stage if report else "error"
    if report is not None and report.verdict == "error":
        failed = "error"  # the check could not run: no reward either way
    why = ""
    if failed is None and s is not None and s >= a.novelty_gate:
        failed = "novelty"
        why = (
            f"max similarity {similarity_in_group:.3f} to candidate {nearest} of its generation"
            f" group, earlier in candidate order (at or above the gate {a.novelty_gate})"
        )
    known = _known_status(ctx, member)
    if known is not None and s is not None:  # the very file of a known environment
        s = 1.0
        if failed is None:
            failed, why = "novelty", f"the file is a known environment ({known}): nothing new"
    if why and report is not None:  # its report said admitted: say what the group decided
        ctx.archive().amend_validation(
            f"{group_id}-{position}", _rejected_at_novelty(report, why, s)
        )
    rate = stages["calibration"].data.get("pass_rate") if "calibration" in stages else None
    return Candidate(
        position, member or {}, report, failed, embedding, known, similarity=s, pass_rate=rate
    )


def _failed_stages(row: Candidate) -> set[str]:
    """Every stage a judged candidate failed: those its report says failed, and novelty when
    the group rejected it there."""
    failed: set[str] = {s.stage for s in row.report.stages if not s.ok} if row.report else set()
    if row.failed == "novelty":
        failed.add("novelty")
    return failed


def _graded(
    ctx: WorkerContext,
    row: Candidate,
    meta: dict[str, Any],
    completion: dict[str, Any],
    gamma: float,
) -> tuple[GradedCompletion, RewardParts | None]:
    """One candidate's completion with its reward and the reward's parts (none if its check
    could not run); a scored candidate is recorded in the archive, its reward's parts with
    it."""
    if row.failed == "error":
        unscored = GradedCompletion(
            **completion,
            reward=None,
            outcome="env_error",
            detail="the admission check could not run",
        )
        return unscored, None
    a = ctx.settings.admission
    parts = generator_reward(_failed_stages(row), row.pass_rate, row.similarity, gamma, a)
    _record_candidate(ctx, row, meta, parts)
    scored = GradedCompletion(
        **completion,
        reward=parts.total,
        outcome="scored",
        detail=row.failed or "admitted",
    )
    return scored, parts


def _record_group(
    ctx: WorkerContext,
    group: GradedGroup,
    rows: list[Candidate],
    parts: list[RewardParts | None],
    gamma: float,
    meta: dict[str, Any],
) -> None:
    """The group in the archive's metrics (kind `generation`, numbered in the order groups
    are finalised): its proposal mode (and the group a repair group repairs), each
    candidate's outcome, reward and the reward's case (and the task an `own_task` candidate
    named), for the run report and the bench."""
    number = int(ctx.redis().incr(keys.generation_count(group.run)))
    tasks = list(meta.get("tasks") or [None] * len(rows))
    candidates: list[dict[str, Any]] = []
    for row, c, p, task in zip(rows, group.completions, parts, tasks, strict=True):
        candidate: dict[str, Any] = {
            "outcome": row.failed or "admitted",
            "reward": c.reward,
            "case": p.case if p else None,
        }
        if task is not None:
            candidate["task"] = task
        candidates.append(candidate)
    values: dict[str, Any] = {
        "group_id": group.group_id,
        "gamma": gamma,
        "mode": meta.get("mode", "topic"),
        "candidates": candidates,
    }
    if meta.get("repair_of"):
        values["repair_of"] = meta["repair_of"]
    ctx.archive().record_metrics(group.run, number, "generation", group.policy_version, values)


def _generator_group(
    run: str,
    group_id: str,
    meta: dict[str, Any],
    rows: list[Candidate],
    completions: list[GradedCompletion],
    gamma: float,
) -> GradedGroup:
    """The generation group as the rollout stream carries it (generator role)."""
    versions = [c.policy_version for c in completions]
    return GradedGroup(
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
        data=GeneratorGroupData.model_validate(
            {
                "funnel": [r.failed or "admitted" for r in rows],
                "gamma": gamma,
                "parents": meta.get("parents", []),
                "mode": meta.get("mode", "topic"),
                "repair_of": meta.get("repair_of"),
            }
        ),
    )


def expire_group(ctx: WorkerContext, run: str, group_id: str, reason: str) -> bool:
    """Finalise a generation group as expired, unless it completed first (its group is then on
    its way to the stream): close its record, then record each candidate as expired. A
    candidate whose admission was done gets its environment row, rejected with the funnel
    outcome `expired` and no reward; one still running gets a validation report with verdict
    `error` under its job id (so its own late report is not recorded). True if it expired."""
    from evoenv_worker.proposal_code import written_code

    client = ctx.redis()
    if not GroupTracker(client, run).expire(generation_key(group_id)):
        return False
    archive = ctx.archive()
    meta = json.loads(client.get(keys.candidate(run, generation_key(group_id))) or "{}")
    members = GroupTracker(client, run).results(generation_key(group_id))
    why = f"expired: {reason}"
    for position, member in sorted(members.items(), key=lambda item: int(item[0])):
        job_id = f"{group_id}-{position}"
        if member is not None and "report" in member:
            report = ValidationReport.model_validate(member["report"])
            row = Candidate(position, member, report, "expired", known=_known_status(ctx, member))
            _record_candidate(ctx, row, meta, None, expired=why)
            continue
        completion = meta.get("completions", [])[int(position)]
        source = written_code(str(completion.get("text", "")))
        expired = ValidationReport(
            file=f"candidate_{group_id}_{position}.py",
            name=None,
            verdict="error",
            failed_stage=None,
            stages=[],
            error=why,
        )
        archive.record_validation(job_id, source_sha(source), expired, adhoc=False)
    return True


def _gamma(client: Any, run: str, embeddings: list[EnvEmbedding], settings: Settings) -> float:
    """gamma from the repetitiveness of the last `repetition_window` generation groups, this one
    included (`RepetitionTracker`). The window's per-group means live in Redis, newest first,
    so that workers finalising groups at the same time each add theirs and read all of them."""
    a = settings.admission
    matrix = [[similarity(x, y, a.novelty_prompt_weight) for y in embeddings] for x in embeddings]
    mean = mean_pairwise_similarity(matrix)
    key = keys.repetition(run)
    if mean is not None:
        client.lpush(key, mean)
        client.ltrim(key, 0, a.repetition_window - 1)
    newest_first = [float(v) for v in client.lrange(key, 0, -1)]
    return RepetitionTracker(a.repetition_window, reversed(newest_first)).gamma(a)


def _rejected_at_novelty(report: ValidationReport, why: str, s: float | None) -> ValidationReport:
    """`report` (every stage passed) with its novelty stage failed for `why`."""
    stages = [
        stage.model_copy(
            update={"ok": False, "detail": why, "data": {**stage.data, "similarity": s}}
        )
        if stage.stage == "novelty"
        else stage
        for stage in report.stages
    ]
    return report.model_copy(
        update={"verdict": "rejected", "failed_stage": "novelty", "stages": stages}
    )


def _known_status(ctx: WorkerContext, member: dict[str, Any] | None) -> str | None:
    """The status of the archive's row of this very file when it is not a candidate's (a
    seed, an admitted, retired or quarantined environment), else None."""
    sha = (member or {}).get("sha")
    row = ctx.archive().environment(sha) if sha else None
    return row.status if row is not None and row.status not in ("candidate", "rejected") else None


def _record_candidate(
    ctx: WorkerContext,
    row: Candidate,
    meta: dict[str, Any],
    reward: RewardParts | None,
    expired: str = "",
) -> None:
    """The candidate in the archive: admitted only if every stage passed, with its lineage
    (`expired`: why its group expired, kept in its stats)."""
    report = row.report
    sha = row.member.get("sha")
    if report is None or not sha or not report.name:
        return
    if row.known is not None:  # that row is not this candidate's to judge
        log.info("candidate_is_known", env=report.name, env_sha=sha, status=row.known)
        return
    archive = ctx.archive()
    source = str(row.member.get("source") or "")
    archive.add_environment(
        report.name, source, status="candidate", origin="generated", parents=meta.get("parents", [])
    )
    clash = archive.by_name(report.name)
    admitted = row.failed is None and (clash is None or clash.sha == sha)
    stats = admission_stats(report, admitted=admitted)
    stats.reward = reward
    stats.funnel = "name clash" if row.failed is None and not admitted else row.failed or "admitted"
    if expired:
        stats.expired = expired
    archive.update_environment(
        sha,
        status="admitted" if admitted else "rejected",
        stats=stats,
        embedding=row.embedding.to_json() if row.embedding else None,
    )
