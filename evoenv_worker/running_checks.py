"""L2 to L5: the admission stages that run the environment (docs/CONTRACT.md#admission-stages).

Each check is a plain function over a `Runner` that returns a `Check`; the validator chains
them and the seeds' contract test calls them with more seeds. Whatever a `Runner` returns, a
check returns or raises `EnvironmentOutputError`: a rejection at the stage that was running.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from evoenv_worker.sandbox.host import OpResult
from shared.config import ValidationSettings
from shared.environment import (
    ANSWER_CAP,
    ORACLE_KINDS,
    default_answer_text,
    extract_answer,
    is_snake_case,
    perturbations,
)
from shared.errors import EnvironmentOutputError
from shared.messages import Trigger

GARBAGE_PROBES = ("qwerty zxcvb !! ??", "¯\\_(ツ)_/¯ 𝔤𝔞𝔯𝔟𝔞𝔤𝔢 \x07")
BLANK_LOOKALIKES = frozenset("\u115f\u1160\u2800\u3164\uffa0\U0001d159")
"""Letters and symbols to Unicode that show as nothing: the Hangul fillers, the Braille blank,
the musical null notehead."""


class Runner(Protocol):
    """Runs sandbox operations on one environment source (see `sandbox/runner.py`).

    None of the checks imports environment code: everything runs in the sandbox, and what comes
    back is treated as data. The sandbox's host checks every result's shape
    (`sandbox/results.py`); the checks read values through helpers that check them again
    (`made_value`, `_score_of`, `canonical`, ...).
    """

    def run(self, ops: list[dict[str, Any]]) -> list[OpResult]: ...


FreshRunner = Callable[[int], AbstractContextManager[Runner]]
"""A runner in a brand-new sandbox process started with the given hash seed."""


@dataclass(frozen=True, slots=True)
class Meta:
    name: str
    description: str
    oracle: str
    min_difficulty: int
    max_difficulty: int

    @property
    def difficulties(self) -> list[int]:
        """The tested difficulties: min, middle and max."""
        lo, hi = self.min_difficulty, self.max_difficulty
        return list(dict.fromkeys([lo, (lo + hi) // 2, hi]))


@dataclass(frozen=True, slots=True)
class Item:
    """One sampled instance, as the sandbox returned it."""

    seed: int
    difficulty: int
    instance: dict[str, Any]
    reference: Any
    prompt: str
    answer_text: str

    @classmethod
    def from_value(cls, seed: int, difficulty: int, value: Any) -> Item:
        """The item of an `instance` op's value (`EnvironmentOutputError` if it is not one)."""
        made = made_value(value, seed, difficulty)
        return cls(
            seed,
            difficulty,
            made["instance"],
            made["reference"],
            made["prompt"],
            made["answer_text"],
        )

    @property
    def trigger(self) -> Trigger:
        return Trigger(seed=self.seed, difficulty=self.difficulty)


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    detail: str
    trigger: Trigger | None = None
    data: dict[str, Any] = field(default_factory=dict)


def canonical(value: Any) -> str:
    """`value` as compact JSON with sorted keys: equal values, equal texts.

    The values compared are the environment's: one JSON cannot write (too deep, an integer
    past Python's digit limit, not JSON at all) is an `EnvironmentOutputError`."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise EnvironmentOutputError(
            f"a value the environment returned cannot be written as JSON ({type(exc).__name__})"
        ) from None


_MADE_TYPES = {"instance": dict, "prompt": str, "answer_text": str, "round_trip": dict}


def made_value(value: Any, seed: int | None = None, difficulty: int | None = None) -> Any:
    """An `instance` op's value, its shape checked (`EnvironmentOutputError` if it is wrong)."""
    if not (
        type(value) is dict
        and "reference" in value
        and all(type(value.get(key)) is kind for key, kind in _MADE_TYPES.items())
        and all(type(value["round_trip"].get(key)) is bool for key in ("instance", "reference"))
    ):
        raise EnvironmentOutputError(
            "the instance op returned a value of the wrong shape", seed=seed, difficulty=difficulty
        )
    return value


def _score_of(result: OpResult, trigger: Trigger) -> float:
    """A score op's value as a float (`EnvironmentOutputError` if it is not in [0, 1])."""
    value = result.value
    if type(value) not in (bool, int, float) or not 0 <= value <= 1:
        raise EnvironmentOutputError(
            f"the scorer returned {_shown(value)}, not a number in [0, 1]",
            seed=trigger.seed,
            difficulty=trigger.difficulty,
        )
    return float(value)


def _shown(value: Any) -> str:
    """A short repr of a value the environment returned (bounded: a huge integer, a deep list
    or a long string is never printed whole)."""
    kind = type(value)
    if kind is int and not -(10**20) < value < 10**20:
        return "a large integer"
    if kind is list or kind is dict:
        return f"a JSON {'array' if kind is list else 'object'}"
    if kind not in (str, int, float, bool, type(None)):
        return f"a {kind.__name__[:40]}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def instance_op(seed: int, difficulty: int) -> dict[str, Any]:
    return {"op": "instance", "seed": seed, "difficulty": difficulty}


# --------------------------------------------------------------------------------------- L2


def describe(runner: Runner) -> tuple[Check, Meta | None]:
    """Read and check the class attributes (part of L2)."""
    (result,) = runner.run([{"op": "describe"}])
    if not result.ok:
        return Check(False, f"the environment cannot be loaded: {result.reason}"), None
    attrs = result.value if isinstance(result.value, dict) else {}
    name, oracle = attrs.get("name"), attrs.get("oracle")
    lo, hi = attrs.get("min_difficulty"), attrs.get("max_difficulty")
    if not is_snake_case(name):
        return Check(False, f"name must be a snake_case string, got {_shown(name)}"), None
    if oracle not in ORACLE_KINDS:
        return Check(
            False, f"oracle must be one of {', '.join(ORACLE_KINDS)}, got {_shown(oracle)}"
        ), None
    if not (type(lo) is int and type(hi) is int and lo <= hi):
        return Check(
            False,
            "min_difficulty and max_difficulty must be ints with min <= max, got "
            f"{_shown(lo)} and {_shown(hi)}",
        ), None
    description = attrs.get("description")
    if not isinstance(description, str) or not description.strip():
        return Check(False, "description must be a non-empty string"), None
    problem = _not_text(description) or (
        None if _visible(description) else "holds no visible character"
    )
    if problem:
        return Check(False, f"the description {problem}"), None
    return Check(True, "attributes ok"), Meta(str(name), description, str(oracle), lo, hi)


def check_executes(
    runner: Runner, meta: Meta, seeds: Sequence[int], settings: ValidationSettings
) -> tuple[Check, list[Item]]:
    """L2: every routine returns, in its limits, values of the right types, for every seed at
    the min, middle and max difficulty."""
    pairs = [(seed, d) for d in meta.difficulties for seed in seeds]
    ops = [instance_op(seed, d) for seed, d in pairs]
    ops += [{"op": "score", "from": k, "answer": None} for k in range(len(pairs))]
    started = time.monotonic()
    results = runner.run(ops)
    waited = time.monotonic() - started
    items: list[Item] = []
    for k, (seed, difficulty) in enumerate(pairs):
        trigger = Trigger(seed=seed, difficulty=difficulty)
        result = results[k]
        if not result.ok:
            return Check(False, _failure_text(result) + _overruns(results, waited), trigger), []
        value = made_value(result.value, seed, difficulty)
        if not value["round_trip"]["instance"]:
            return Check(
                False,
                "the instance does not survive a JSON round trip unchanged "
                "(use str keys, lists not tuples, no sets or objects)",
                trigger,
            ), []
        if not value["round_trip"]["reference"]:
            kind = value.get("reference_type")
            return Check(
                False,
                f"the reference ({kind[:40] if isinstance(kind, str) else _shown(kind)}) "
                "does not survive a JSON round trip unchanged",
                trigger,
            ), []
        prompt = value["prompt"]
        if not prompt.strip():
            return Check(False, "render returned an empty prompt", trigger), []
        problem = _not_text(prompt) or (None if _visible(prompt) else "holds no visible character")
        if problem:
            return Check(False, f"the prompt {problem}", trigger), []
        for what in ("answer_text", "instance", "reference"):
            problem = _not_text(_as_text(value[what]))
            if problem:
                return Check(False, f"the {what} {problem}", trigger), []
        size = len(prompt.encode("utf-8", "replace"))
        if size > settings.max_prompt_bytes:
            return Check(
                False,
                f"the prompt is {size} bytes; the limit is {settings.max_prompt_bytes}",
                trigger,
            ), []
        items.append(Item.from_value(seed, difficulty, value))
    for k, item in enumerate(items):
        scored = results[len(pairs) + k]
        trigger = Trigger(seed=item.seed, difficulty=item.difficulty, answer=item.answer_text[:500])
        if not scored.ok:
            return Check(False, _failure_text(scored), trigger), []
        _score_of(scored, trigger)
    slowest = max((sum(r.seconds.values()) for r in results), default=0.0)
    return Check(
        True,
        f"{len(pairs)} instances sampled, solved, rendered and scored; slowest "
        f"call {slowest * 1000:.1f} ms",
        data={"slowest_seconds": slowest},
    ), items


def _not_text(text: str) -> str | None:
    """Why `text` is not valid UTF-8 text (it holds a lone surrogate, which no UTF-8 file,
    terminal, JSON message or database holds), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid UTF-8 text: it holds a lone surrogate (U+{ord(text[exc.start]):04X})"
    return None


def _as_text(value: Any) -> str:
    """A string as it is, any other value as its JSON text (keys and strings unescaped); ""
    where JSON cannot write it (`canonical` rejects that where values are compared)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return ""


def _visible(text: str) -> bool:
    """True when `text` holds a character that shows: a letter, digit, punctuation mark or
    symbol that is no blank look-alike (spaces, format characters such as zero-width ones,
    controls and lone combining marks show nothing by themselves)."""
    return any(
        unicodedata.category(char)[0] in "LNPS" and char not in BLANK_LOOKALIKES for char in text
    )


def _overruns(results: Sequence[OpResult], waited: float) -> str:
    """Where more than one call of a request ran past its limit, how long the request waited
    in all and how many calls were not run after them (a sampler that loops costs a limit a
    call, up to the sandbox's failures a request); else ""."""
    over = sum(result.kind == "timeout" for result in results)
    if over < 2:
        return ""
    skipped = sum(result.kind == "skipped" for result in results)
    after = f"; the {skipped} calls after them not run" if skipped else ""
    return f" ({over} calls ran past the limit: {waited:.0f} s waited in all{after})"


def _failure_text(result: OpResult) -> str:
    if result.kind == "tamper":  # "the environment modified the framework: ..."
        return result.error
    what = {
        "timeout": "ran past the time limit",
        "memory": "ran out of memory",
        "crash": "crashed the process",
        "output": "returned too much or malformed output",
        "value": "returned an invalid score",
    }.get(result.kind, "failed")
    routine = f"{result.routine} " if result.routine else ""
    return f"{routine}{what}: {result.error}" if result.error else f"{routine}{what}"


# --------------------------------------------------------------------------------------- L3


def _signatures(results: list[OpResult]) -> list[str | None]:
    """What must be identical across processes and orders, per instance (None: failed)."""
    signatures: list[str | None] = []
    for result in results:
        if not result.ok:
            signatures.append(None)
            continue
        made = made_value(result.value)
        signatures.append(
            canonical([made["instance"], made["reference"], made["prompt"], made["answer_text"]])
        )
    return signatures


def check_deterministic(
    fresh: FreshRunner,
    items: Sequence[Item],
    hash_seeds: tuple[int, int] = (1, 2),
    answer_cap: int = ANSWER_CAP,
) -> Check:
    """L3: identical instance, reference and prompt in two fresh processes with different hash
    seeds, the same result for each item alone as inside a batch in a different order, and the
    same scores for the same answers in both processes (`_score_ops`)."""
    ops = [instance_op(item.seed, item.difficulty) for item in items]
    expected: list[str | None] = [
        canonical([i.instance, i.reference, i.prompt, i.answer_text]) for i in items
    ]
    with fresh(hash_seeds[0]) as first:
        batch = _signatures(first.run(ops))
        alone = [_signatures(first.run([op]))[0] for op in ops]
        reverse = _signatures(first.run(ops[::-1]))[::-1]
        scoring = _score_ops(items, _perturbed_texts(first, items), answer_cap)
        scored = first.run(ops + scoring)[len(ops) :]
    with fresh(hash_seeds[1]) as second:
        other = _signatures(second.run(ops))
        rescored = second.run(ops + scoring[::-1])[len(ops) :][::-1]
    comparisons: list[tuple[list[str | None], list[str | None], str]] = [
        (
            batch,
            other,
            f"differs between two fresh processes with hash seeds {hash_seeds[0]} and "
            f"{hash_seeds[1]} (iteration over a set or hash-ordered data?)",
        ),
        (
            expected,
            batch,
            "differs between two fresh processes with different hash seeds "
            "(iteration over a set or hash-ordered data?)",
        ),
        (
            batch,
            alone,
            "differs when the item runs alone rather than in a batch (state carried across calls?)",
        ),
        (
            batch,
            reverse,
            "differs when the batch runs in a different order (state carried across calls?)",
        ),
    ]
    for left, right, why in comparisons:
        for item, a, b in zip(items, left, right, strict=True):
            if a is None or b is None:
                return Check(
                    False,
                    "a call that succeeded once failed in a fresh process "
                    "(nondeterministic failure)",
                    item.trigger,
                )
            if a != b:
                return Check(False, f"the instance, reference or prompt {why}", item.trigger)
    unstable = _score_disagreement(items, scoring, scored, rescored)
    if unstable is not None:
        return unstable
    return Check(
        True,
        f"{len(items)} instances identical across 2 fresh processes, alone and in a reversed "
        f"batch; {len(scoring)} answers score the same in both",
    )


def _score_ops(
    items: Sequence[Item], perturbed: dict[int, list[str]], cap: int
) -> list[dict[str, Any]]:
    """The answers L3 scores in each process, as score ops on a batch of the items' instance
    ops: each item's reference, another item's answer at its difficulty and the perturbations
    of its reference (near misses, where partial credit lives), extracted as a solver's are."""
    ops: list[dict[str, Any]] = []
    for k, item in enumerate(items):
        borrowed = next(
            (o.answer_text for o in items if o.difficulty == item.difficulty and o is not item),
            None,
        )
        texts = [item.answer_text, *([borrowed] if borrowed else []), *perturbed.get(k, [])]
        answers = dict.fromkeys(a for a in (_extracted(t, cap) for t in texts) if a is not None)
        ops += [{"op": "score", "from": k, "answer": answer} for answer in answers]
    return ops


_STABLE_FAILURES = frozenset({"exception", "value", "type"})
"""How a scorer fails by what it computes (not by running out of time or memory)."""


def _score_disagreement(
    items: Sequence[Item],
    ops: Sequence[dict[str, Any]],
    first: Sequence[OpResult],
    second: Sequence[OpResult],
) -> Check | None:
    """The failing check where one answer got different scores in the two processes (or was
    scored in one and made the scorer raise in the other); None where none did. A scorer that
    fails on an answer in both, or runs out of time or memory, is left to L5."""
    for op, a, b in zip(ops, first, second, strict=True):
        item = items[op["from"]]
        trigger = Trigger(seed=item.seed, difficulty=item.difficulty, answer=op["answer"][:500])
        if a.ok and b.ok:
            left, right = _score_of(a, trigger), _score_of(b, trigger)
            if left != right:
                return Check(
                    False,
                    f"the scorer gives the same answer different scores in two fresh processes "
                    f"({left:g} and {right:g}): a score must follow from the instance, reference "
                    "and answer alone (random numbers, a clock or state carried across calls?)",
                    trigger,
                )
        elif a.ok != b.ok and (a.kind if b.ok else b.kind) in _STABLE_FAILURES:
            return Check(
                False,
                "the scorer fails on an answer in one fresh process and scores it in the other "
                f"(nondeterministic failure): {_failure_text(b if a.ok else a)}",
                trigger,
            )
    return None


# --------------------------------------------------------------------------------------- L4


def check_nontrivial(items: Sequence[Item], meta: Meta, settings: ValidationSettings) -> Check:
    """L4: references and prompts vary, difficulty matters, the prompt does not leak."""
    for difficulty in meta.difficulties:
        group = [item for item in items if item.difficulty == difficulty]
        references = {canonical(item.reference) for item in group}
        prompts = {item.prompt for item in group}
        trigger = Trigger(difficulty=difficulty)
        if len(references) < settings.min_distinct_references:
            return Check(
                False,
                f"only {len(references)} distinct reference(s) over {len(group)} "
                f"seeds at difficulty {difficulty}; at least "
                f"{settings.min_distinct_references} required (constant answer?)",
                trigger,
            )
        if len(prompts) < settings.min_distinct_prompts:
            return Check(
                False,
                f"only {len(prompts)} distinct prompt(s) over {len(group)} seeds at "
                f"difficulty {difficulty}; at least {settings.min_distinct_prompts} required",
                trigger,
            )
    if meta.min_difficulty == meta.max_difficulty:
        return Check(False, "min_difficulty equals max_difficulty: difficulty must matter")
    sizes = {
        d: [len(canonical(i.instance)) for i in items if i.difficulty == d]
        for d in (meta.min_difficulty, meta.max_difficulty)
    }
    low = sum(sizes[meta.min_difficulty]) / len(sizes[meta.min_difficulty])
    high = sum(sizes[meta.max_difficulty]) / len(sizes[meta.max_difficulty])
    ratio = high / low if low else float("inf")
    if ratio < settings.min_length_ratio:
        return Check(
            False,
            f"difficulty does not matter: instances at difficulty "
            f"{meta.max_difficulty} average {high:.0f} JSON characters vs {low:.0f} at "
            f"{meta.min_difficulty} (ratio {ratio:.2f}, at least "
            f"{settings.min_length_ratio} required)",
        )
    checked = [item for item in items if len(item.answer_text) >= settings.leak_min_chars]
    leaks = [item for item in checked if item.answer_text in item.prompt]
    if len(leaks) > settings.leak_max_fraction * len(items):
        return Check(
            False,
            f"the prompt reveals the answer: answer_text appears verbatim in "
            f"{len(leaks)} of {len(items)} prompts",
            leaks[0].trigger,
        )
    shorter = f"answers shorter than {settings.leak_min_chars} characters"
    if not checked:
        leaked = f"the answer text in the prompt: not checked ({shorter})"
    else:
        leaked = f"{len(leaks)} of {len(checked)} prompts contain the answer text"
        if len(checked) < len(items):
            leaked += f" ({len(items) - len(checked)} {shorter} not checked)"
    return Check(
        True,
        f"references and prompts vary; length ratio {ratio:.2f}; {leaked}",
        data={"length_ratio": round(ratio, 3), "leaks": len(leaks), "leak_checked": len(checked)},
    )


def check_well_posed(
    runner: Runner, items: Sequence[Item], meta: Meta, settings: ValidationSettings
) -> Check:
    """L4, this project's addition: the prompt determines the answer.

    `render` is the complete problem statement (docs/CONTRACT.md#the-environment-class), so an
    answer that is right for one instance is right for every instance with the same prompt. A
    renderer that leaves part of the instance out (a list's first number but not the list) gives
    the solver a question with no right answer, which only luck passes at calibration; a small
    reviewer model missed one such file three times out of three. Prompts that leave something
    out collide most where instances are smallest, so beside the sampled items
    `well_posed_seeds` more instances are sampled at the min difficulty. For each pair of
    instances with the same prompt and different answer texts (up to `well_posed_pairs`), the
    first one's answer text must score 1.0 on the second one's instance and reference."""
    extra: list[Item] = []
    if settings.well_posed_seeds > 0:
        first = max((item.seed for item in items), default=-1) + 1  # beyond L2's seeds
        ops = [
            instance_op(first + k, meta.min_difficulty) for k in range(settings.well_posed_seeds)
        ]
        for op, result in zip(ops, runner.run(ops), strict=True):
            trigger = Trigger(seed=op["seed"], difficulty=op["difficulty"])
            if not result.ok:
                return Check(False, f"sampling failed: {_failure_text(result)}", trigger)
            extra.append(Item.from_value(op["seed"], op["difficulty"], result.value))
    sampled = [*items, *extra]
    by_prompt: dict[str, list[Item]] = {}
    for item in sampled:
        by_prompt.setdefault(item.prompt, []).append(item)
    pairs = [
        (a, b)
        for same in by_prompt.values()
        for a in same
        for b in same
        if a is not b and a.answer_text.strip() != b.answer_text.strip()
    ][: settings.well_posed_pairs]
    answers = [_extracted(a.answer_text, settings.answer_cap) for a, _ in pairs]
    checked = [(pair, answer) for pair, answer in zip(pairs, answers, strict=True) if answer]
    results = (
        runner.run(
            [
                {"op": "score", "answer": answer, "instance": b.instance, "reference": b.reference}
                for (_, b), answer in checked
            ]
        )
        if checked
        else []
    )
    for ((a, b), answer), result in zip(checked, results, strict=True):
        trigger = Trigger(seed=b.seed, difficulty=b.difficulty, answer=answer[:500])
        if not result.ok:
            return Check(
                False,
                f"the scorer failed on seed {a.seed}'s answer to seed {b.seed}, whose prompt is "
                f"the same: {_failure_text(result)}",
                trigger,
            )
        score = _score_of(result, trigger)
        if score < 1.0:
            return Check(
                False,
                f"the prompt does not determine the answer: seeds {a.seed} and {b.seed} at "
                f"difficulty {b.difficulty} have the same prompt, but seed {a.seed}'s answer "
                f"{a.answer_text[:80]!r} scores {score:g} on seed {b.seed} (its "
                f"answer is {b.answer_text[:80]!r}); render must state the whole problem",
                trigger,
            )
    return Check(
        True,
        f"{len(by_prompt)} distinct prompts over {len(sampled)} instances; "
        f"{len(checked)} answers checked across instances with the same prompt",
        data={"instances": len(sampled), "prompts": len(by_prompt), "same_prompt": len(checked)},
    )


def check_l4(
    runner: Runner, items: Sequence[Item], meta: Meta, settings: ValidationSettings
) -> Check:
    """L4 as the validator runs it: `check_nontrivial`, then `check_well_posed`."""
    nontrivial = check_nontrivial(items, meta, settings)
    if not nontrivial.ok:
        return nontrivial
    posed = check_well_posed(runner, items, meta, settings)
    if not posed.ok:
        return posed
    return Check(True, f"{nontrivial.detail}; {posed.detail}", data=nontrivial.data | posed.data)


# --------------------------------------------------------------------------------------- L5


@dataclass(frozen=True, slots=True)
class Probe:
    item: int
    label: str
    text: str
    """What the probe writes in its answer span."""
    answer: str
    """What the scorer sees: `text` wrapped as `<answer>text</answer>` and extracted."""
    rule: str
    """reference (must score 1.0), always (must score < 1.0), differs (judged by oracle kind)."""


def check_scorer(
    runner: Runner, items: Sequence[Item], meta: Meta, settings: ValidationSettings
) -> Check:
    """L5: the reference scores 1.0; empty, garbage, wrong-type and spray probes score below
    1.0; borrowed and perturbed answers are rejected (always for equality environments, in at
    least half of the cases for feasibility ones); the scorer never raises. Every probe, the
    reference included, is wrapped as `<answer>...</answer>` and extracted as a solver's
    answer is: a reference whose answer text does not survive that (longer than the answer
    cap, say) fails here, since no answer could ever score 1.0."""
    for item in items:
        extraction = extract_answer(f"<answer>{item.answer_text}</answer>", settings.answer_cap)
        if extraction.answer is None:
            return Check(
                False,
                "the reference's answer text cannot be read back from a solver's answer span: "
                f"{extraction.problem} (answer_text gives {len(item.answer_text)} characters)",
                item.trigger,
            )
    perturbed = _perturbed_texts(runner, items)
    probes = list(_probes(items, perturbed, meta, settings))
    ops = [instance_op(item.seed, item.difficulty) for item in items]
    ops += [{"op": "score", "from": p.item, "answer": p.answer} for p in probes]
    results = runner.run(ops)
    for k, result in enumerate(results[: len(items)]):
        if not result.ok:
            return Check(False, f"re-sampling failed: {_failure_text(result)}", items[k].trigger)
    rejected = considered = 0
    for probe, result in zip(probes, results[len(items) :], strict=True):
        item = items[probe.item]
        trigger = Trigger(seed=item.seed, difficulty=item.difficulty, answer=probe.text[:500])
        if not result.ok:
            return Check(
                False,
                f"the scorer failed on the {probe.label} probe: {_failure_text(result)}",
                trigger,
            )
        score = _score_of(result, trigger)
        if probe.rule == "reference" and score != 1.0:
            return Check(
                False, f"the reference answer (answer_text) scores {score:g}, not 1.0", trigger
            )
        if probe.rule == "always" and score >= 1.0:
            return Check(False, f"the scorer accepts the {probe.label} probe", trigger)
        if probe.rule == "differs":
            if meta.oracle == "equality" and score >= 1.0:
                return Check(
                    False,
                    f"the scorer accepts the {probe.label} probe, which differs from the reference",
                    trigger,
                )
            considered += 1
            rejected += score < 1.0
    if considered and rejected < settings.feasibility_reject_fraction * considered:
        return Check(
            False,
            f"the scorer accepts borrowed or perturbed answers in "
            f"{considered - rejected} of {considered} cases; it must reject at least "
            f"{settings.feasibility_reject_fraction:.0%}",
        )
    return Check(
        True,
        f"{len(probes)} probes on {len(items)} instances; the reference scores "
        f"1.0 everywhere; {rejected} of {considered} borrowed/perturbed answers rejected",
        data={"probes": len(probes), "rejected": rejected, "considered": considered},
    )


def _extracted(text: str, cap: int) -> str | None:
    return extract_answer(f"<answer>{text}</answer>", cap).answer


def _probes(
    items: Sequence[Item], perturbed: dict[int, list[str]], meta: Meta, settings: ValidationSettings
) -> Iterator[Probe]:
    cap = settings.answer_cap
    spray_numbers = [str(n) for n in range(settings.spray_range[0], settings.spray_range[1] + 1)]
    for k, item in enumerate(items):
        reference = _extracted(item.answer_text, cap)
        if reference is None:
            continue  # `check_scorer` rejects the file before any probe runs
        yield Probe(k, "reference", item.answer_text, reference, "reference")
        others = [items[(k + j) % len(items)].answer_text for j in range(1, len(items))]
        same_level = [
            items[j] for j in range(len(items)) if j != k and items[j].difficulty == item.difficulty
        ]
        candidates: list[tuple[str, str, str]] = [("empty", "", "always")]
        candidates += [("garbage", text, "always") for text in GARBAGE_PROBES]
        candidates.append(("wrong-type", _wrong_type(item.reference), "always"))
        candidates.append(
            ("spray", _spray(others[: settings.spray_instances], spray_numbers, cap), "always")
        )
        borrowed = next(
            (o.answer_text for o in same_level if o.answer_text != item.answer_text), None
        )
        if borrowed is not None:
            candidates.append(("other-instance", borrowed, "differs"))
        candidates += [("perturbed", text, "differs") for text in perturbed.get(k, [])]
        for label, text, rule in candidates:
            extracted = _extracted(text, cap)
            if extracted is None or extracted == reference:
                continue  # not a valid probe, or the reference's own text: skipped
            yield Probe(k, label, text, extracted, rule)


def _wrong_type(reference: Any) -> str:
    if isinstance(reference, (list, tuple, dict)):
        return "true"
    return '{"answer": [1, 2, 3]}'


def _spray(others: list[str], numbers: list[str], cap: int) -> str:
    parts = [*others, *numbers]
    while len(", ".join(parts)) > cap and len(parts) > len(numbers):
        parts.pop(len(parts) - len(numbers) - 1)
    return ", ".join(parts)


def _perturbed_texts(runner: Runner, items: Sequence[Item]) -> dict[int, list[str]]:
    """The environment's own answer_text of each perturbed reference (default text on failure)."""
    values = [(k, value) for k, item in enumerate(items) for value in perturbations(item.reference)]
    results = runner.run([{"op": "answer_text", "reference": value} for _, value in values])
    texts: dict[int, list[str]] = {}
    for (k, value), result in zip(values, results, strict=True):
        text = result.value if result.ok and type(result.value) is str else None
        if text is None:
            try:
                text = default_answer_text(value)
            except ValueError:  # an integer past Python's digit limit for `str`
                item = items[k]
                raise EnvironmentOutputError(
                    "a perturbation of the reference cannot be written as text (an integer "
                    "past Python's digit limit?)",
                    seed=item.seed,
                    difficulty=item.difficulty,
                ) from None
        texts.setdefault(k, []).append(text)
    return texts
