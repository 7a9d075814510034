"""What a generation group's candidates are asked, and the `repair` mode's turns: from a
finished generation group's record, one more turn for each candidate that failed L1-L5, with
its failing stage's report (`shared.proposal_modes.repair_messages`); the repairs form a
generation group of their own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evoenv_worker.verdict import generation_key
from shared import keys
from shared.groups import GroupTracker
from shared.messages import ProposalJob, ValidationReport
from shared.proposal_modes import repair_messages, repairable

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext


@dataclass(frozen=True, slots=True)
class Turns:
    """What a generation group's candidates are asked: one prompt each, in candidate order."""

    prompts: list[list[dict[str, str]]]
    positions: list[int]
    """A repair group: each repaired candidate's position in the group repaired."""
    parents: list[str]
    """The examples' sha (a repair group: the repaired group's parents)."""


def turns_of(ctx: WorkerContext, job: ProposalJob) -> Turns:
    """G times the job's prompt, or a repair job's turns (`repair_turns`)."""
    if job.mode == "repair" and job.repair_of is not None:
        return repair_turns(ctx, job.run, job.repair_of, job.group_size)
    return Turns([job.messages] * job.group_size, [], job.parents)


def repair_turns(ctx: WorkerContext, run: str, group_id: str, most: int) -> Turns:
    """The repair turns of generation group `group_id`: its first `most` candidates that
    failed L1-L5, each with the group's conversation, its reply and its report. No prompts
    when the group is itself a repair (a repair is not repaired again), its record is gone,
    or no finished candidate of it failed L1-L5."""
    client = ctx.redis()
    meta: dict[str, Any] = json.loads(
        client.get(keys.candidate(run, generation_key(group_id))) or "{}"
    )
    messages = meta.get("messages")
    if not messages or meta.get("mode") == "repair":
        return Turns([], [], [])
    members = GroupTracker(client, run).results(generation_key(group_id))
    completions = meta.get("completions", [])
    prompts: list[list[dict[str, str]]] = []
    positions: list[int] = []
    for position, member in sorted(members.items(), key=lambda item: int(item[0])):
        report = (
            ValidationReport.model_validate(member["report"])
            if member and "report" in member
            else None
        )
        index = int(position)
        if report is None or not repairable(report) or index >= len(completions):
            continue
        reply = str(completions[index].get("text", ""))
        prompts.append(repair_messages(messages, reply, report))
        positions.append(index)
        if len(prompts) == most:
            break
    return Turns(prompts, positions, list(meta.get("parents", [])))
