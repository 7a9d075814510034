"""What the learner keeps of each step for a person to read: a few of the completions it trained
on, with their rewards and outcomes, the extracted answer beside the reference, and for
generator groups the candidate files with their verdicts (`evoenv pool serve`'s run view,
TensorBoard's text tab)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from shared.environment import extract_answer
from shared.messages import GeneratorGroupData, GradedGroup, SolverGroupData

TEXT_CHARS = 4000
"""Most characters of a completion (an answer, a candidate file) kept in a sample."""
PROMPT_CHARS = 1500
"""Most characters of a solver group's prompt kept in a sample."""


def step_samples(batch: Sequence[GradedGroup], count: int, answer_cap: int) -> list[dict[str, Any]]:
    """Up to `count` completions of the step's `batch`, taken from its groups in turn (each
    group's first completion, then each group's second, ...), so that a sample shows as many
    groups, and both roles, as it can. Each is a JSON object:

    role, group_id, env, env_sha, seed, difficulty, policy_version (of the completion), reward,
    outcome, detail, text (cut at `TEXT_CHARS`), and for a solver group its prompt (cut at
    `PROMPT_CHARS`), the answer extracted from the text (None: no answer span) and the
    reference's answer text; for a generator group the candidate's verdict (its admission
    outcome) and its validation job id (the funnel page's)."""
    columns = [[(group, k) for k in range(len(group.completions))] for group in batch]
    taken = [pair for row in itertools.zip_longest(*columns) for pair in row if pair is not None]
    return [_sample(group, k, answer_cap) for group, k in taken[:count]]


def _sample(group: GradedGroup, k: int, answer_cap: int) -> dict[str, Any]:
    completion = group.completions[k]
    sample: dict[str, Any] = {
        "role": group.role,
        "group_id": group.group_id,
        "env": group.env_name,
        "env_sha": group.env_sha,
        "seed": group.seed,
        "difficulty": group.difficulty,
        "policy_version": completion.policy_version,
        "reward": completion.reward,
        "outcome": completion.outcome,
        "detail": completion.detail[:TEXT_CHARS],
        "text": completion.text[:TEXT_CHARS],
    }
    if isinstance(group.data, GeneratorGroupData):
        funnel = group.data.funnel
        sample["verdict"] = funnel[k] if k < len(funnel) else None
        sample["job_id"] = f"{group.group_id}-{k}"  # as generation_groups names its job
    elif isinstance(group.data, SolverGroupData):
        sample["prompt"] = group.prompt[:PROMPT_CHARS]
        sample["answer"] = extract_answer(completion.text, answer_cap).answer
        sample["reference"] = group.data.reference
    return sample


def as_markdown(step: int, samples: Sequence[dict[str, Any]]) -> str:
    """The samples as one Markdown text (TensorBoard's text tab): a line of figures each, then
    the completion in a code block."""
    parts = [f"step {step}: {len(samples)} samples"]
    for sample in samples:
        figures = (
            f"**{sample['role']}** `{sample['env']}` difficulty {sample['difficulty']}, "
            f"version {sample['policy_version']}: reward {sample['reward']}, {sample['outcome']}"
        )
        if sample["role"] == "generator":
            figures += f", verdict {sample.get('verdict')}"
        else:
            figures += f"; answer `{sample.get('answer')}`, reference `{sample.get('reference')}`"
        fence = "~~~~" if "```" in sample["text"] else "```"
        parts.append(f"{figures}\n\n{fence}\n{sample['text']}\n{fence}")
    return "\n\n".join(parts)
