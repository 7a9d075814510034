"""The proposal modes beside `topic` (`proposal_prompt.proposal_messages`): a mutation of a pool
member, a repair turn for a candidate that failed L1-L5, and a task of the model's own naming;
which mode a generation group uses is drawn with `learner.proposal_modes`
(docs/DESIGN.md#proposal-modes)."""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Mapping, Sequence

from shared.messages import MECHANICAL_STAGES, ProposalMode, ValidationReport
from shared.proposal_prompt import (
    CONTRACT_BRIEF,
    REPLY_FORMAT,
    SYSTEM,
    Example,
    examples_text,
    helpers_first,
)

STAGE_MEANING = {
    "L1": "static checks of the file",
    "L2": "sample, solve, render and score run on fresh instances",
    "L3": "the same seed gives the same instance, answer and prompt in another process",
    "L4": "the task is not trivial: answers vary across instances and no constant passes",
    "L5": "the scorer accepts the reference answer and rejects wrong ones",
}
"""What each mechanical stage checks, in the words a repair prompt uses (docs/CONTRACT.md)."""
REPORT_CHARS = 2000
"""Longest failing-stage detail a repair prompt quotes."""
OWN_TASK_PREFIX = "Task:"
"""How an `own_task` reply's first line names its task."""
_OWN_TASK = re.compile(r"^[\s*#>`_]*task[\s*_]*[:\-][\s*_]*(.+?)[\s*`_]*$", re.IGNORECASE)


def draw_mode(
    weights: Mapping[ProposalMode, float], rng: random.Random, *, can_repair: bool
) -> ProposalMode:
    """A mode drawn by `weights` (`learner.proposal_modes`); `repair` only when a finished
    group is there to repair (`can_repair`). No draw from `rng` when one mode is possible,
    so the default (topic alone) draws exactly what it drew before modes existed."""
    modes = [m for m, w in weights.items() if w > 0 and (can_repair or m != "repair")]
    if len(modes) == 1:
        return modes[0]
    return rng.choices(modes, weights=[weights[m] for m in modes])[0]


# ------------------------------------------------------------------------------ mutation


def sample_code(source: str) -> str | None:
    """The source of the `sample` method of the file's first class that defines one (as
    written, indented), or None when there is none or the file does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "sample":
                lines = source.splitlines()
                start = min([item.lineno, *(d.lineno for d in item.decorator_list)]) - 1
                return "\n".join(lines[start : item.end_lineno]) + "\n"
    return None


def mutation_messages(member: Example) -> list[dict[str, str]]:
    """The `mutation` prompt: one pool member's file, and the request for a new environment
    that keeps its `sample` (the same instances) and asks a different question about them
    with a new `solve`, `render` and `score`. Keeping the member's `solve` under a new prompt
    is rejected at novelty (its references equal the member's: the same-oracle check)."""
    sample = sample_code(member.source) or ""
    keep = (
        f"Copy its `sample` method exactly, with the helpers and constants it uses:\n"
        f"```python\n{sample.rstrip()}\n```\n"
        if sample
        else "Copy its `sample` method exactly, with the helpers and constants it uses.\n"
    )
    user = (
        f"{CONTRACT_BRIEF}\n"
        f"A pool member ({member.oracle} oracle), file {member.name}.py:\n"
        f"```python\n{helpers_first(member.source).strip()}\n```\n\n"
        f"Write ONE new environment file that asks a DIFFERENT question about the same "
        f"instances as {member.name}. {keep}"
        "Then write a new name, description, `solve`, `render` and `score` for the new "
        'question, and set oracle to "equality" or "feasibility" to suit it. The new `solve` '
        f"must compute the answer to the new question: {member.name}'s own `solve` under a "
        "new prompt is rejected, because admission runs it on your instances. "
        f"{REPLY_FORMAT}"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------ own task


def own_task_messages(examples: Sequence[Example]) -> list[dict[str, str]]:
    """The `own_task` prompt: the examples as `topic` shows them, and the request to name a
    new task in the reply's first line (`Task: ...`), then write its file."""
    names = ", ".join(e.name for e in examples)
    user = (
        f"{CONTRACT_BRIEF}\n{examples_text(examples)}\n\n"
        f"Write ONE new environment file for a different problem than the examples ({names}): "
        "a new algorithmic task of your own choosing whose reference answer code computes "
        f"exactly. The FIRST line of your reply names the task: `{OWN_TASK_PREFIX} <the task "
        "in one sentence>`. Then give the complete file in a single ```python code block, and "
        'nothing else. The oracle attribute is only "equality" or "feasibility".'
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def own_task_of(text: str) -> str | None:
    """The task an `own_task` reply names in its first non-blank line (`Task: ...`, markdown
    emphasis allowed), or None when that line names none. The file is taken from the reply
    as written (`proposal_code.written_code`), whatever the first line says."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    found = _OWN_TASK.match(first)
    return found.group(1).strip() if found else None


# -------------------------------------------------------------------------------- repair


def repairable(report: ValidationReport | None) -> bool:
    """Whether a candidate gets a repair turn: it was rejected at L1-L5."""
    return (
        report is not None
        and report.verdict == "rejected"
        and report.failed_stage in MECHANICAL_STAGES
    )


def failure_text(report: ValidationReport) -> str:
    """The failing stage of a rejected candidate's report in words: the stage and what it
    checks, the reason as the stage gave it (the exception and its message where code
    raised), and the instance that triggered it (seed, difficulty, the answer text tried)."""
    stage = report.failed_stage or "?"
    failing = next((s for s in report.stages if s.stage == stage and not s.ok), None)
    detail = failing.detail if failing is not None else (report.error or "no detail")
    if len(detail) > REPORT_CHARS:
        detail = detail[:REPORT_CHARS] + " ..."
    lines = [
        f"Admission rejected this file at stage {stage} "
        f"({STAGE_MEANING.get(stage, 'an admission stage')}).",
        f"Reason: {detail}",
    ]
    trigger = failing.trigger if failing is not None else None
    if trigger is not None and (trigger.seed is not None or trigger.difficulty is not None):
        lines.append(
            f"It failed on the instance of seed {trigger.seed} at difficulty {trigger.difficulty}."
        )
    if trigger is not None and trigger.answer is not None:
        lines.append(f"Answer text tried: {trigger.answer!r}")
    return "\n".join(lines)


def repair_messages(
    messages: Sequence[Mapping[str, str]], reply: str, report: ValidationReport
) -> list[dict[str, str]]:
    """The `repair` prompt: the proposal's conversation, the candidate's reply as the model
    wrote it, and one more user turn with its failing stage's report (`failure_text`) asking
    for the corrected file."""
    turn = (
        f"{failure_text(report)}\n\n"
        "Fix the file so that it passes this stage and every other one of the contract above. "
        f"{REPLY_FORMAT}"
    )
    return [
        *({"role": m["role"], "content": m["content"]} for m in messages),
        {"role": "assistant", "content": reply},
        {"role": "user", "content": turn},
    ]
