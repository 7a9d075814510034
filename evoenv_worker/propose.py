"""The generator's side: the proposal prompt, and getting the code back out of a response.

The prompt shows a few pool members as complete example files (seeds first, then admitted
environments, chosen to spread across oracle kinds), the contract in brief, and asks for one
new environment file.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

CONTRACT_BRIEF = """\
An environment is ONE Python file with exactly one class deriving from Environment
(`from shared.environment import Environment`). It defines:
- class attributes: name (snake_case, new), description (one sentence), oracle ("equality" when
  the answer is unique, "feasibility" when any answer meeting the constraints is right),
  min_difficulty = 1, max_difficulty = 10;
- sample(self, rng, difficulty) -> dict: one random instance, using only `rng` (a random.Random);
  a plain JSON dict (str keys, lists, ints, strs); larger or harder as difficulty grows;
- solve(self, instance): the reference answer computed by code from the instance alone;
- render(self, instance) -> str: the full problem statement in words, saying exactly how the
  final answer must be written; it must not reveal the answer;
- score(self, instance, reference, answer: str) -> float: 1.0 when the answer text is correct,
  else 0.0; parse strictly; never raise on any string;
- optionally answer_text(self, reference) -> str: how a perfect answer is written.
Only the standard library modules random, math, itertools, functools, collections, heapq,
bisect, fractions, decimal, string, re, json, statistics, operator, typing, dataclasses, enum.
No eval, exec, open, getattr, globals, no dunder attributes except __init__, no global state.
The oracle attribute is exactly the string "equality" or "feasibility". Define in the file
every helper function and constant it uses: nothing from the examples is available to it.
A good environment is easy to solve with code (a dynamic program, a search, a checker) but
hard to solve by reasoning in words, and its difficulty scales smoothly.
"""


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    oracle: str
    source: str
    sha: str


def choose_examples(pool: Sequence[Example], k: int, rng: random.Random) -> list[Example]:
    """Up to `k` examples spread across oracle kinds, the pool order (seeds first) as ties."""
    by_kind: dict[str, list[Example]] = {}
    for example in pool:
        by_kind.setdefault(example.oracle, []).append(example)
    for members in by_kind.values():
        rng.shuffle(members)
    chosen: list[Example] = []
    kinds = sorted(by_kind)
    while len(chosen) < k and any(by_kind.values()):
        for kind in kinds:
            if by_kind[kind] and len(chosen) < k:
                chosen.append(by_kind[kind].pop())
    return chosen


def proposal_messages(examples: Sequence[Example]) -> list[dict[str, str]]:
    """The chat messages asking for one new environment file."""
    shown = "\n\n".join(
        f"Example {i + 1} ({e.oracle} oracle), file {e.name}.py:\n```python\n{e.source.strip()}\n```"
        for i, e in enumerate(examples)
    )
    names = ", ".join(e.name for e in examples)
    user = (
        f"{CONTRACT_BRIEF}\n{shown}\n\n"
        f"Write ONE new environment file for a different problem than the examples ({names}): "
        "pick a new algorithmic task with a code oracle. Reply with the complete file in a single "
        "```python code block and nothing else."
    )
    return [
        {"role": "system", "content": "You write Python reinforcement-learning environments."},
        {"role": "user", "content": user},
    ]


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_START = re.compile(r"^(?:from|import|class|\"\"\"|#)\b", re.MULTILINE)


def extract_code(text: str) -> str:
    """The environment file in a response: the fenced block that defines a class (the last
    such, else the longest fence), or an unterminated fence, or the text from the first line
    that starts code. Empty when there is nothing that looks like code (L1 rejects it)."""
    blocks = _FENCE.findall(text)
    with_class = [b for b in blocks if re.search(r"^class\s", b, re.MULTILINE)]
    if with_class:
        return with_class[-1].strip() + "\n"
    if blocks:
        return max(blocks, key=len).strip() + "\n"
    opened = re.search(r"```[ \t]*(?:python|py|python3)?[ \t]*\n", text, re.IGNORECASE)
    if opened:
        return text[opened.end() :].strip() + "\n"
    start = _START.search(text)
    return text[start.start() :].strip() + "\n" if start else ""
