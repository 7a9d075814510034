"""The environment contract and what the framework does around it (docs/CONTRACT.md): the
`Environment` base class, seeding (`make_rng`, `TRAIN_SEEDS`, `EVAL_SEEDS`), the prompt
(`build_prompt`), answer extraction (`extract_answer`; `extract_lenient`, a measurement only)
and grade outcomes (`Grade`, `grade_value`). Standard library only: it is bound into the sandbox, where environment code
imports it as `from shared.environment import Environment`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

__all__ = [
    "ANSWER_CAP",
    "ANSWER_INSTRUCTION",
    "EVAL_SEEDS",
    "MAX_SEED",
    "ORACLE_KINDS",
    "TRAIN_SEEDS",
    "Environment",
    "Extraction",
    "Grade",
    "Outcome",
    "build_prompt",
    "default_answer_text",
    "extract_answer",
    "extract_lenient",
    "grade_value",
    "is_snake_case",
    "json_round_trips",
    "make_rng",
    "perturbations",
    "seed_global_random",
]

ORACLE_KINDS = ("equality", "feasibility")
"""`equality`: the scorer compares with the reference; `feasibility`: it checks constraints."""

TRAIN_SEEDS = range(0, 1_000_000_000)
"""Seeds the trainer may draw instances from."""

EVAL_SEEDS = range(1_000_000_000, 2_000_000_000)
"""Seeds reserved for held-out evaluation: disjoint from `TRAIN_SEEDS`, never trained on."""
MAX_SEED = 2**62
"""The largest seed `evoenv sample` and the pool's web page take; seeds start at 0."""

ANSWER_CAP = 4096
"""Default maximum length, in characters, of an extracted answer; longer is a format error."""

ANSWER_INSTRUCTION = (
    "Reason step by step if it helps. Then write your final answer, exactly in the format "
    "asked for above, between <answer> and </answer> tags, for example <answer>your final "
    "answer</answer>. Only the last <answer> span counts."
)
"""The framework's answer-format instruction, appended to every rendered problem."""

_SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*", re.ASCII)
"""A name, matched whole (`fullmatch`: `$` would also match before a final newline)."""
_LABEL = re.compile(r":|=|\bis\b", re.IGNORECASE)
"""What ends a label before an untagged answer ("Answer: 3", "x = 3", "the length is 3")."""
_MARKUP = " \t\r\n`*$\"'<>"
"""Characters stripped from both ends of an untagged answer (emphasis, code, quotes, <word>)."""


class Environment:
    """Base class of every environment (docs/CONTRACT.md#the-environment-class).

    Subclasses set the class attributes and implement `sample`, `solve`, `render` and `score`.
    All randomness must come from the `rng` passed to `sample`.
    """

    name: ClassVar[str] = ""
    """snake_case, unique in the pool."""
    description: ClassVar[str] = ""
    """One sentence: what the problem is."""
    oracle: ClassVar[str] = "equality"
    """`equality` or `feasibility`."""
    min_difficulty: ClassVar[int] = 1
    max_difficulty: ClassVar[int] = 10

    def sample(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        """Build one instance from `rng` at `difficulty`; JSON round-trippable."""
        raise NotImplementedError

    def solve(self, instance: dict[str, Any]) -> Any:
        """The reference answer (JSON-serialisable), from the instance alone."""
        raise NotImplementedError

    def render(self, instance: dict[str, Any]) -> str:
        """The complete problem statement, including the exact final-answer format."""
        raise NotImplementedError

    def score(self, instance: dict[str, Any], reference: Any, answer: str) -> float:
        """Score the extracted answer text in [0, 1]; never raise on any string."""
        raise NotImplementedError

    def answer_text(self, reference: Any) -> str:
        """How a perfect solver writes `reference` in its answer span."""
        return default_answer_text(reference)


def default_answer_text(reference: Any) -> str:
    """Scalars with `str()`, lists and tuples joined by ", "."""
    if isinstance(reference, (list, tuple)):
        return ", ".join(str(item) for item in reference)
    return str(reference)


def perturbations(value: Any) -> list[Any]:
    """Near misses of a reference (L5's perturbed probes, and a training grading call's): integers
    +1 and -1, floats x1.5, one character of a string changed, one element of a list dropped
    (and its last scalar perturbed)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value * 1.5 if value else 1.5]
    if isinstance(value, str):
        return [_change_one_char(value)] if value else ["x"]
    if isinstance(value, list) and value:
        out: list[Any] = [value[1:], value[:-1]]
        for index in range(len(value) - 1, -1, -1):
            if isinstance(value[index], (int, float, str)) and not isinstance(value[index], bool):
                out.append([*value[:index], perturbations(value[index])[0], *value[index + 1 :]])
                break
        return out
    return []


def _change_one_char(text: str) -> str:
    index = len(text) // 2
    char = text[index]
    if char.isdigit():
        new = str((int(char) + 1) % 10) if char.isascii() else "0"
    elif char.isascii() and char.isalpha():
        base = "a" if char.islower() else "A"
        new = chr((ord(char) - ord(base) + 1) % 26 + ord(base))
    else:
        new = "x"
    return text[:index] + new + text[index + 1 :]


def is_snake_case(name: object) -> bool:
    """True for a string that is ASCII snake_case as a whole: nothing before or after it."""
    return isinstance(name, str) and _SNAKE_CASE.fullmatch(name) is not None


def make_rng(name: str, seed: int, difficulty: int) -> random.Random:
    """The instance's random generator: the same triple gives the same stream everywhere."""
    return random.Random(f"{name}:{seed}:{difficulty}")


def seed_global_random(name: str, seed: int, difficulty: int) -> None:
    """The framework also seeds the global `random`, so a stray `random.random()` is stable."""
    random.seed(f"{name}:{seed}:{difficulty}")


def build_prompt(rendered: str) -> str:
    """What the solver sees: the rendered problem, then the answer-format instruction."""
    return f"{rendered.rstrip()}\n\n{ANSWER_INSTRUCTION}"


def json_round_trips(value: Any) -> bool:
    """True when `value` survives `json.loads(json.dumps(value))` unchanged (types included)."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return _same(json.loads(text), value)


def _same(a: Any, b: Any) -> bool:
    # `==` alone treats 1 == 1.0 == True and (1, 2) != [1, 2] inconsistently; compare types too.
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class Outcome(StrEnum):
    SCORED = "scored"
    """The scorer returned a number in [0, 1]."""
    FORMAT_ERROR = "format_error"
    """No readable answer span: reward 0."""
    ENV_ERROR = "env_error"
    """The environment failed (raised, timed out, out of memory, bad value): never a reward."""


@dataclass(frozen=True, slots=True)
class Grade:
    """One graded answer. `reward` is None exactly when the outcome is `env_error`."""

    outcome: Outcome
    reward: float | None
    detail: str = ""

    @classmethod
    def format_error(cls, detail: str) -> Grade:
        return cls(Outcome.FORMAT_ERROR, 0.0, detail)

    @classmethod
    def env_error(cls, detail: str) -> Grade:
        return cls(Outcome.ENV_ERROR, None, detail)


def grade_value(value: object) -> Grade:
    """Turn what a scorer returned into a grade: a float, int or bool in [0, 1] is `scored`.

    The type must be exactly `bool`, `int` or `float`, as `type()` tells it: not a subclass,
    and not an object posing as one (`isinstance` believes an object's own `__class__`, and its
    `__float__` may give anything, NaN included). NaN is outside [0, 1]."""
    if type(value) is bool:
        return Grade(Outcome.SCORED, 1.0 if value else 0.0)
    if type(value) is int or type(value) is float:
        if 0 <= value <= 1:  # NaN fails both comparisons
            return Grade(Outcome.SCORED, float(value))
        shown = repr(value) if type(value) is float or -(10**12) < value < 10**12 else "an int"
        return Grade.env_error(f"score {shown} is outside [0, 1]")
    kind = type(value).__name__[:60]  # the environment's class may have any name
    return Grade.env_error(f"score has type {kind}, expected a number in [0, 1]")


@dataclass(frozen=True, slots=True)
class Extraction:
    """The answer text the scorer sees, or why there is none (then a format error)."""

    answer: str | None
    problem: str = ""


def extract_answer(response: str, cap: int = ANSWER_CAP) -> Extraction:
    """The text of the last `<answer>...</answer>` span of what counts, stripped.

    What counts: the text after the last `</think>`; a `<think>` with no `</think>` after it
    means the model never finished thinking, so there is no answer.
    """
    counted = _counted(response)
    if counted is None:
        return Extraction(None, "unclosed <think>")
    return _tagged(counted, cap)


def extract_lenient(response: str, cap: int = ANSWER_CAP) -> Extraction:
    """The answer taken leniently: a measurement of content beside the strict `extract_answer`
    (docs/CONTRACT.md, lenient extraction); training rewards never use it.

    What counts is the same text; where it holds an `<answer>...</answer>` span, the strict
    answer (none when over the cap). Otherwise: the text after the last `<answer>` (an answer
    cut short) or all of it, with any `</answer>` dropped; its last non-blank line; from that,
    the text after the last label mark (`:`, `=` or the word `is`, any case) when there is one;
    stripped of whitespace, `` ` ``, `*`, `$`, quotes and angle brackets at both ends, then of
    trailing periods. Empty, or longer than `cap`: no answer.
    """
    counted = _counted(response)
    if counted is None:
        return Extraction(None, "unclosed <think>")
    end = counted.rfind("</answer>")
    if end >= 0 and counted.rfind("<answer>", 0, end) >= 0:
        return _tagged(counted, cap)
    opened = counted.rfind("<answer>")
    text = counted[opened + len("<answer>") :] if opened >= 0 else counted
    line = text.replace("</answer>", "").strip().rsplit("\n", 1)[-1]
    cut = 0
    for label in _LABEL.finditer(line):
        cut = label.end()  # after the last one
    answer = line[cut:].strip(_MARKUP).rstrip(".").strip(_MARKUP)
    if not answer:
        return Extraction(None, "no text to take as the answer")
    if len(answer) > cap:
        return Extraction(None, f"answer of {len(answer)} characters exceeds the cap of {cap}")
    return Extraction(answer)


def _counted(response: str) -> str | None:
    """The text after the last `</think>` (all of it when there is none); None when a `<think>`
    is left open after it."""
    close = response.rfind("</think>")
    if response.rfind("<think>") > close:
        return None
    return response[close + len("</think>") :] if close >= 0 else response


def _tagged(counted: str, cap: int) -> Extraction:
    """The last `<answer>...</answer>` span of `counted`, stripped, within `cap`."""
    end = counted.rfind("</answer>")
    start = counted.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return Extraction(None, "no <answer>...</answer> span")
    answer = counted[start + len("<answer>") : end].strip()
    if len(answer) > cap:
        return Extraction(None, f"answer span of {len(answer)} characters exceeds the cap of {cap}")
    return Extraction(answer)
