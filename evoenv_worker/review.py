"""Semantic self-review: K reviews of a candidate, each ending in a structured verdict.

Each review walks the data flow, traces one real instance, checks the algorithm and the scorer,
and ends with a JSON verdict; a reject, an unreadable or a missing verdict rejects the
candidate. Verdicts gate the pool, never the generator's reward (docs/CONTRACT.md#review).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from shared.messages import Trace

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "data_flow": {"type": "string"},
        "trace": {"type": "string"},
        "algorithm": {"type": "string"},
        "scorer": {"type": "string"},
        "verdict": {"type": "string", "enum": ["accept", "reject"]},
        "bug": {"type": "string"},
    },
    "required": ["data_flow", "trace", "algorithm", "scorer", "verdict", "bug"],
    "additionalProperties": False,
}
"""The review's structured form; `verdict` is `reject` when a likely bug was found."""


@dataclass(frozen=True, slots=True)
class ReviewVerdict:
    accept: bool
    bug: str
    readable: bool = True

    @property
    def reason(self) -> str:
        if not self.readable:
            return "the verdict could not be read"
        return "accepted" if self.accept else f"likely bug: {self.bug or 'unspecified'}"


def clip(text: str, limit: int) -> str:
    """`text`, cut at `limit` characters with " ..." added where it was longer."""
    return text if len(text) <= limit else text[:limit] + " ..."


def review_messages(source: str, trace: Trace) -> list[dict[str, str]]:
    """The reviewer's prompt for one candidate and one traced instance."""
    reference = clip(json.dumps(trace.reference), 2000)
    prompt = clip(trace.prompt, 4000)
    user = (
        "Review this Python environment for reinforcement learning. It samples a problem "
        "instance (sample), computes the reference answer (solve), writes the problem in words "
        "(render) and scores an answer text (score).\n\n"
        f"```python\n{source.strip()}\n```\n\n"
        f"A real instance (seed {trace.seed}, difficulty {trace.difficulty}) rendered as:\n"
        f"<<<\n{prompt}\n>>>\n"
        f"Its reference answer from solve: {reference}\n"
        f"A perfect answer text: {trace.answer_text}\n\n"
        "Check, step by step: (1) data_flow: does every field render and solve use come from "
        "sample? (2) trace: is the reference above really the correct answer to the problem as "
        "stated? (3) algorithm: is solve correct for every instance? (4) scorer: does score give "
        "1.0 exactly to correct answers written as the problem asks, and less to wrong ones? "
        "Then answer with a JSON object with the keys data_flow, trace, algorithm, scorer (short "
        'findings), verdict ("accept", or "reject" if you found a likely bug) and bug (the bug, '
        "or an empty string)."
    )
    return [
        {"role": "system", "content": "You are a careful code reviewer. You answer in JSON."},
        {"role": "user", "content": user},
    ]


_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_verdict(text: str) -> ReviewVerdict:
    """Read a review's verdict; anything unreadable is `readable=False` (a reject)."""
    data = _load_object(text)
    if data is None:
        return ReviewVerdict(False, "", readable=False)
    verdict = data.get("verdict")
    if not isinstance(verdict, str) or verdict.strip().lower() not in {"accept", "reject"}:
        return ReviewVerdict(False, "", readable=False)
    bug = data.get("bug")
    bug_text = bug.strip() if isinstance(bug, str) else ""
    return ReviewVerdict(verdict.strip().lower() == "accept", bug_text[:500])


def _load_object(text: str) -> dict[str, Any] | None:
    candidates = [text.strip()]
    fenced = re.findall(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    candidates += fenced[::-1]
    match = _OBJECT.search(text)
    if match:
        candidates.append(match.group(0))
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def summarise(verdicts: list[ReviewVerdict], expected: int) -> tuple[bool, str]:
    """(passes, detail): passes only when `expected` (K) reviews came back, every one readable
    and accepting; a review that did not come back counts as a reject (the stage fails closed)."""
    rejects = [v for v in verdicts if not (v.readable and v.accept)]
    parts = [f"review {i + 1}: {v.reason}" for i, v in enumerate(verdicts)]
    parts += [f"review {i + 1}: no verdict came back" for i in range(len(verdicts), expected)]
    return (not rejects and bool(verdicts) and len(verdicts) >= expected), "; ".join(parts)
