"""The `repair` proposal mode in the worker: from a finished generation group's record, one
more turn for each candidate that failed L1-L5, with its failing stage's report
(`shared.proposal_modes.repair_messages`); the repairs form a generation group of their own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evoenv_worker.verdict import generation_key
from shared import keys
from shared.groups import GroupTracker
from shared.messages import ValidationReport
from shared.proposal_modes import repair_messages, repairable

if TYPE_CHECKING:
    from evoenv_worker.context import WorkerContext


@dataclass(frozen=True, slots=True)
class RepairTurns:
    """What a repair group asks: one prompt per candidate to repair, in candidate order."""

    prompts: list[list[dict[str, str]]]
    positions: list[int]
    """Each repaired candidate's position in the group repaired."""
    parents: list[str]
    """The repaired group's parents (the repairs descend from the same examples)."""


def repair_turns(ctx: WorkerContext, run: str, group_id: str, most: int) -> RepairTurns:
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
        return RepairTurns([], [], [])
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
    return RepairTurns(prompts, positions, list(meta.get("parents", [])))
