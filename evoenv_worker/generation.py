"""Generation groups: sample G candidates, then, when every candidate's admission is done,
compare them in candidate order (in-group novelty), compute gamma and every reward, record the
candidates in the archive and append the group to the rollout stream (generator role).

A group the learner stops waiting for (past `learner.generation_deadline`, or its proposal
failed for good) is finalised as expired (`expire_group`): its record is closed, so nothing of
it reaches the stream later, and its candidates' archive records say it expired; no reward."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import structlog

from evoenv_worker.admission import KEEP_SECONDS, admission_stats, embedding_of, generation_key
from shared import keys
from shared.config import Settings
from shared.db import source_sha
from shared.groups import GroupTracker
from shared.inference import Sampling
from shared.messages import (
    CandidateRef,
    GradedCompletion,
    GradedGroup,
    ProposalJob,
    ValidateJob,
    ValidationReport,
)
from shared.rewards import generator_reward, mean_pairwise_similarity
from shared.rollouts import append_group

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext

log = structlog.get_logger(__name__)


def propose(ctx: WorkerContext, job: ProposalJob) -> list[ValidateJob]:
    """Sample G candidates; open their generation group; one validation job per candidate
    (none for a group the learner gave up on, expired before or while its proposal ran)."""
    from evoenv_worker.generate import record
    from evoenv_worker.propose import extract_code, prompt_text

    tracker = GroupTracker(ctx.redis(), job.run)
    if tracker.expired(generation_key(job.group_id)):
        log.info("proposal_skipped", group_id=job.group_id, detail="its group expired")
        return []
    sampling = Sampling(n=job.group_size, temperature=job.temperature, max_tokens=job.max_tokens)
    completions = [record(c) for c in ctx.inference().chat(job.messages, sampling)]
    prompt = prompt_text(job.messages)
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
    if tracker.expired(generation_key(job.group_id)):
        log.info("proposal_skipped", group_id=job.group_id, detail="its group expired meanwhile")
        return []
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
                source=extract_code(completion.text, prompt),
                adhoc=False,
                model_stages=True,
                candidate=ref,
            )
        )
    return jobs


def open_group(
    ctx: WorkerContext, run: str, group_id: str, size: int, meta: dict[str, Any]
) -> None:
    """A generation group of `size` candidates; `meta` (prompt, parents) is kept with it."""
    client = ctx.redis()
    client.set(keys.candidate(run, generation_key(group_id)), json.dumps(meta), ex=KEEP_SECONDS)
    GroupTracker(client, run).open(generation_key(group_id), [str(i) for i in range(size)])


def finalize_group(ctx: WorkerContext, run: str, group_id: str) -> GradedGroup:
    """Every candidate of a generation group is done: in-group novelty in candidate order,
    gamma, the rewards, the archive, and one generator group on the rollout stream."""
    from evoenv_worker.novelty import EnvEmbedding, similarity

    settings, client = ctx.settings, ctx.redis()
    a = settings.admission
    meta = json.loads(client.get(keys.candidate(run, generation_key(group_id))) or "{}")
    members = GroupTracker(client, run).results(generation_key(group_id))
    ordered = sorted(members.items(), key=lambda item: int(item[0]))
    earlier: list[tuple[str, EnvEmbedding]] = []
    rows: list[dict[str, Any]] = []
    for position, member in ordered:
        report = (
            ValidationReport.model_validate(member["report"])
            if member and "report" in member
            else None
        )
        stages = {s.stage: s for s in report.stages} if report else {}
        embedding = EnvEmbedding.from_json(embedding_of(report)) if report else None
        in_group, nearest = 0.0, None  # nearest: the earlier candidate (its index) most like it
        if embedding is not None:
            for other, e in earlier:
                score = similarity(embedding, e, a.novelty_prompt_weight)
                if nearest is None or score > in_group:
                    in_group, nearest = score, other
            earlier.append((position, embedding))
        pool_similarity = stages["novelty"].data.get("similarity") if "novelty" in stages else None
        s = None if pool_similarity is None else max(float(pool_similarity), in_group)
        failed = report.failed_stage if report else "error"
        if report is not None and report.verdict == "error":
            failed = "error"  # the check could not run: no reward either way
        why = ""
        if failed is None and s is not None and s >= a.novelty_gate:
            failed = "novelty"
            why = (
                f"max similarity {in_group:.3f} to candidate {nearest} of its generation group, "
                f"earlier in candidate order (at or above the gate {a.novelty_gate})"
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
        rows.append(
            {
                "member": member or {},
                "report": report,
                "failed": failed,
                "similarity": s,
                "pass_rate": rate,
                "embedding": embedding,
                "known": known,
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


def expire_group(ctx: WorkerContext, run: str, group_id: str, reason: str) -> bool:
    """Finalise a generation group as expired, unless it completed first (its group is then on
    its way to the stream): close its record, then record each candidate as expired. A
    candidate whose admission was done gets its environment row, rejected with the funnel
    outcome `expired` and no reward; one still running gets a validation report with verdict
    `error` under its job id (so its own late report is not recorded). True if it expired."""
    from evoenv_worker.propose import extract_code

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
            row = {
                "member": member,
                "report": ValidationReport.model_validate(member["report"]),
                "failed": "expired",
                "embedding": None,
                "known": _known_status(ctx, member),
            }
            _record_candidate(ctx, row, meta, None, expired=why)
            continue
        completion = meta.get("completions", [])[int(position)]
        source = extract_code(str(completion.get("text", "")), str(meta.get("prompt", "")))
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
    row: dict[str, Any],
    meta: dict[str, Any],
    reward: dict[str, Any] | None,
    expired: str = "",
) -> None:
    """The candidate in the archive: admitted only if every stage passed, with its lineage
    (`expired`: why its group expired, kept in its stats)."""
    report: ValidationReport | None = row["report"]
    sha = row["member"].get("sha")
    if report is None or not sha or not report.name:
        return
    if row["known"] is not None:  # that row is not this candidate's to judge
        log.info("candidate_is_known", env=report.name, env_sha=sha, status=row["known"])
        return
    archive = ctx.archive()
    source = str(row["member"].get("source") or "")
    archive.add_environment(
        report.name, source, status="candidate", origin="generated", parents=meta.get("parents", [])
    )
    clash = archive.by_name(report.name)
    admitted = row["failed"] is None and (clash is None or clash.sha == sha)
    stats = {**admission_stats(report), "reward": reward, "funnel": row["failed"] or "admitted"}
    if expired:
        stats["expired"] = expired
    if admitted:
        stats.setdefault("admitted_at", stats["judged_at"])
    else:
        stats.pop("admitted_at", None)
    if row["failed"] is None and not admitted:
        stats["funnel"] = "name clash"
    archive.update_environment(
        sha,
        status="admitted" if admitted else "rejected",
        stats=stats,
        embedding=row["embedding"].to_json() if row["embedding"] else None,
    )
