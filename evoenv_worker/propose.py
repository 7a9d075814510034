"""The generator's side: the proposal prompt, and getting the code back out of a response.

The prompt shows a few pool members as complete example files, the contract in brief, and
asks for one new environment file. Examples are drawn at random, favouring the solver's
frontier: members the solver solves sometimes but not always. A proposal tends to resemble
its examples, and admission wants a pass rate strictly between 0 and 1
(docs/CONTRACT.md#calibration), so examples the solver never (or always) solves mostly breed
candidates calibration rejects.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from evoenv_worker.static import ALLOWED_MODULES, BASE_CLASS, BASE_MODULE

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
The oracle attribute is exactly the string "equality" or "feasibility". Define in the file,
above the class, every helper function and constant it uses, and import every module it uses:
nothing from the examples is available to it.
A good environment is easy to solve with code (a dynamic program, a search, a checker) but
hard to solve by reasoning in words, and its difficulty scales smoothly: at min_difficulty an
instance is tiny (a person solves it in a few steps), each level a little larger.
"""


UNKNOWN_WEIGHT = 0.5
"""Draw weight of an example whose solve rate is not known yet."""
FLOOR_WEIGHT = 0.05
"""Least draw weight: a member the solver never (or always) solves still appears now and then."""
SAME_KIND_FACTOR = 0.5
"""Weight multiplier for an oracle kind already among the chosen examples (a gentle spread)."""


TOPICS = (
    "the number of inversions in a list of integers",
    "the greatest common divisor of a list of integers",
    "the least common multiple of a few small integers",
    "the number of distinct values in a list of integers",
    "the length of the longest run of equal adjacent values in a list",
    "the sum of the digits of a large integer",
    "the number of 1 bits in the binary form of an integer",
    "the value of an arithmetic expression with +, -, * and parentheses",
    "the number of monotone lattice paths through a grid with blocked cells",
    "the fewest coins of given denominations that make an amount",
    "the number of ways to climb n stairs taking 1, 2 or 3 steps at a time",
    "the largest sum of a contiguous part of a list of integers",
    "the n-th term of a linear recurrence modulo a prime",
    "the number of primes up to n",
    "the final position of a robot after a list of moves on a grid",
    "the number of islands in a 0/1 grid",
    "the fewest swaps that sort a permutation",
    "the number of cycles of a permutation",
    "the median of a list of integers",
    "the k-th smallest value of a list of integers",
    "the longest common prefix of a few words",
    "the Roman numeral of an integer",
    "the integer value of a Roman numeral",
    "the number of palindromic substrings of a string",
    "the length of the longest palindromic subsequence of a string",
    "the length of the longest common subsequence of two strings",
    "the smallest path sum through a grid of numbers moving right or down",
    "the number of subsets of a list of integers that sum to a target",
    "the largest number of pairwise non-overlapping intervals",
    "the fewest rooms that hold a list of meetings given as intervals",
    "the total length covered by a union of intervals",
    "the lexicographically smallest topological order of a small directed acyclic graph",
    "the length of a shortest path in a small weighted graph",
    "the weight of a minimum spanning tree of a small weighted graph",
    "the height of a binary search tree built by inserting values in order",
    "the value of a postfix (reverse Polish) expression",
    "the number of trailing zeros of n factorial",
    "the number of (possibly overlapping) occurrences of a pattern in a text",
    "the run-length encoding of a string",
    "the area of the largest rectangle of 1s in a small 0/1 matrix",
    "the number of steps of the Collatz sequence from n down to 1",
    "the water trapped between bars of given heights",
    "the fewest jumps to reach the end of a list of jump lengths",
    "the number of paths between two nodes of a small directed acyclic graph",
    "the bitwise XOR of a list of integers",
    "the number of pairs in a list whose sum is divisible by k",
    "the smallest positive integer missing from a list",
    "the number of derangements of n items modulo a prime",
    "the binomial coefficient C(n, k) modulo a prime",
    "the determinant of a small integer matrix",
    "the fewest knight moves between two squares of a chessboard",
    "the number of domino tilings of a 2 x n board modulo a prime",
    "the day of the week a given number of days after a given day",
    "the number of distinct letters shared by two words",
    "the balance of a bank account after a list of deposits and withdrawals",
    "the number of valid moves of a chess piece on a small board with obstacles",
    "the sum of the values on the main diagonal after rotating a square matrix",
    "the number of carries when adding two integers digit by digit",
    "the integer square root of a large integer",
    "the number of divisors of an integer",
)
"""Tasks a proposal prompt may name, one drawn per prompt (`learner.proposal_topics`): asked
for "a different problem", the 0.5B generator mostly re-sends its example (novelty 0.87-1.0 to
it in a half-hour `evoenv up` run); asked for a named task it writes something new. Simple
tasks with short exact answers, none of them a seed's."""


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    oracle: str
    source: str
    sha: str
    solve_rate: float | None = None
    """The solver's share of full-score answers on this member (None: not known yet)."""


def example_weight(example: Example) -> float:
    """How strongly `example` is favoured: 4a(1-a) for solve rate a (1 at a = 0.5, 0 at a = 0
    or 1) above a small floor; a middling weight while the rate is unknown."""
    if example.solve_rate is None:
        return UNKNOWN_WEIGHT
    a = example.solve_rate
    return FLOOR_WEIGHT + (1.0 - FLOOR_WEIGHT) * 4.0 * a * (1.0 - a)


def choose_examples(pool: Sequence[Example], k: int, rng: random.Random) -> list[Example]:
    """Up to `k` distinct examples drawn without replacement with `example_weight`, a kind
    already drawn weighing `SAME_KIND_FACTOR` as much (module doc)."""
    left = list(pool)
    chosen: list[Example] = []
    while left and len(chosen) < k:
        kinds = {e.oracle for e in chosen}
        weights = [
            example_weight(e) * (SAME_KIND_FACTOR if e.oracle in kinds else 1.0) for e in left
        ]
        pick = rng.choices(range(len(left)), weights=weights)[0]
        chosen.append(left.pop(pick))
    return chosen


def helpers_first(source: str) -> str:
    """`source` with the module-level functions and constants that follow its class moved
    above it, as the example is shown. A model imitating an example writes the class and stops:
    helpers defined after it went missing (L2: "name '_parse_int' is not defined") in most
    rejected proposals of a half-hour `evoenv up` run. Unchanged when anything else follows
    the class, or the class is used at module level after it."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return source
    classes = [(k, node) for k, node in enumerate(body) if isinstance(node, ast.ClassDef)]
    if len(classes) != 1 or classes[0][0] == len(body) - 1:
        return source
    index, cls = classes[0]
    after = body[index + 1 :]
    movable = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign, ast.AnnAssign)
    uses_class = any(
        isinstance(name, ast.Name) and name.id == cls.name
        for node in after
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for name in ast.walk(node)
    )
    if uses_class or not all(isinstance(node, movable) for node in after):
        return source
    lines = source.splitlines(keepends=True)
    start = min([cls.lineno, *(d.lineno for d in cls.decorator_list)]) - 1
    end = cls.end_lineno or len(lines)
    head = "".join(lines[:start]).rstrip()
    helpers = "".join(lines[end:]).strip()
    klass = "".join(lines[start:end]).rstrip()
    return "\n\n\n".join(part for part in (head, helpers, klass) if part) + "\n"


def proposal_messages(examples: Sequence[Example], topic: str = "") -> list[dict[str, str]]:
    """The chat messages asking for one new environment file (about `topic`, if given)."""
    shown = "\n\n".join(
        f"Example {i + 1} ({e.oracle} oracle), file {e.name}.py:\n"
        f"```python\n{helpers_first(e.source).strip()}\n```"
        for i, e in enumerate(examples)
    )
    names = ", ".join(e.name for e in examples)
    task = (
        f"Its task: {topic}."
        if topic
        else "Pick a new algorithmic task whose reference answer code computes exactly."
    )
    user = (
        f"{CONTRACT_BRIEF}\n{shown}\n\n"
        f"Write ONE new environment file for a different problem than the examples ({names}). "
        f'{task} The oracle attribute is only "equality" or "feasibility". Reply with the '
        "complete file in a single ```python code block and nothing else."
    )
    return [
        {"role": "system", "content": "You write Python reinforcement-learning environments."},
        {"role": "user", "content": user},
    ]


def prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    """A chat prompt as one text (what a generation group records, and where
    `extract_code` finds the example files)."""
    return "\n\n".join(m["content"] for m in messages)


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_START = re.compile(r"^(?:from|import|class|\"\"\"|#)\b", re.MULTILINE)


def extract_code(text: str, prompt: str = "") -> str:
    """The environment file in a response: the fenced block that defines a class (the last
    such, else the longest fence), or an unterminated fence, or the text from the first line
    that starts code; completed with `with_missing_helpers` (from the examples in `prompt`)
    and `with_missing_imports`. Empty when there is nothing that looks like code (L1 rejects
    it)."""
    return with_missing_imports(with_missing_helpers(_code_in(text), prompt))


def _code_in(text: str) -> str:
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


def with_missing_helpers(code: str, prompt: str) -> str:
    """`code` with the module-level functions and constants of the example files shown in
    `prompt` that it calls but never defines, copied in above its first class (with those they
    use in turn). A proposal writes its own class and calls the example's `_parse_int` without
    defining it (L2: "name '_parse_int' is not defined", 5 of 44 candidates in a half-hour
    `evoenv up` run): the helper it meant is the one it was shown. Code or examples that do not
    parse are left as they are."""
    shown = shown_helpers(prompt)
    if not shown:
        return code
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    bound, loaded = _names(tree)
    wanted = [name for name in shown if name in loaded - bound]
    added: dict[str, str] = {}
    while wanted:
        name = wanted.pop(0)
        if name in added:
            continue
        added[name] = shown[name]
        _, uses = _names(ast.parse(shown[name]))
        wanted += [n for n in shown if n in uses - bound and n not in added]
    if not added:
        return code
    first = next((node for node in tree.body if isinstance(node, ast.ClassDef)), None)
    if first is None:
        return code  # no class: L1 rejects it whatever is added
    helpers = "".join(source + "\n\n\n" for name, source in shown.items() if name in added)
    lines = code.splitlines(keepends=True)
    at = min([first.lineno, *(d.lineno for d in first.decorator_list)]) - 1
    return "".join(lines[:at]) + helpers + "".join(lines[at:])


@functools.lru_cache(maxsize=16)
def shown_helpers(prompt: str) -> Mapping[str, str]:
    """The module-level functions and single-name constants of the Python files fenced in a
    proposal prompt, by name, in the order shown (the first definition of a name wins).
    Cached: every candidate of a group is completed from the same prompt."""
    helpers: dict[str, str] = {}
    for block in _FENCE.findall(prompt):
        try:
            body = ast.parse(block).body
        except SyntaxError:
            continue
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                name = node.targets[0].id
            else:
                continue
            segment = ast.get_source_segment(block, node, padded=False)
            if segment is not None and name not in helpers:
                helpers[name] = segment
    return MappingProxyType(helpers)


def with_missing_imports(code: str) -> str:
    """`code` with `import m` added for each allowlisted standard-library module `m` that it
    uses as `m.name` but never binds (imports, assigns or takes as an argument); with
    `from m import name` for a bare name it uses but never binds that an allowlisted module
    exports (`deque`, `lru_cache`, `gcd`; `MODULE_ORDER` decides a name several export); and
    with `from shared.environment import Environment` when a class derives from an unbound
    `Environment`. Imitating an example, the 0.5B generator drops `import random` /
    `import re` (L2: "name 're' is not defined"), `from collections import deque`, and now and
    then the base class's import (L1: "the file does not import Environment", 3 of 16
    candidates in a half-hour `evoenv up` run): boilerplate, completed here so that the rest
    of the file gets judged. Nothing else is changed; code that does not parse is returned as
    it is (L1 reports it)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    bound, loaded = _names(tree)
    attribute_of = {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    unbound = loaded - bound
    missing = [f"import {m}\n" for m in sorted(unbound & attribute_of & _IMPORTABLE)]
    exported = _exported_names()
    missing += [
        f"from {exported[name]} import {name}\n"
        for name in sorted(unbound - _IMPORTABLE)
        if name in exported
    ]
    bases = {
        base.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name)
    }
    if BASE_CLASS in bases - bound:
        missing.append(f"from {BASE_MODULE} import {BASE_CLASS}\n")
    if not missing:
        return code
    body = tree.body
    first = 0 if ast.get_docstring(tree, clean=False) is None else 1
    while first < len(body) and _is_future_import(body[first]):
        first += 1
    lines = code.splitlines(keepends=True)
    at = body[first].lineno - 1 if first < len(body) else len(lines)
    return "".join(lines[:at]) + "".join(missing) + "".join(lines[at:])


_IMPORTABLE = ALLOWED_MODULES - {"__future__"}

MODULE_ORDER = (
    "collections",
    "itertools",
    "functools",
    "math",
    "heapq",
    "bisect",
    "fractions",
    "decimal",
    "string",
    "statistics",
    "operator",
    "random",
    "re",
    "json",
    "dataclasses",
    "enum",
    "typing",
)
"""Where a bare name several allowlisted modules export is imported from, first wins
(`Counter` from collections, not typing)."""


@functools.cache
def _exported_names() -> dict[str, str]:
    """Public names of the allowlisted modules (standard library only, never the file's code),
    except builtins and one-letter names (`math.e`), each with the module it comes from."""
    exported: dict[str, str] = {}
    order = [m for m in MODULE_ORDER if m in _IMPORTABLE]
    order += sorted(_IMPORTABLE - set(order))
    for module_name in order:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        for name in names:
            if len(name) > 1 and not name.startswith("_") and not hasattr(builtins, name):
                exported.setdefault(name, module_name)
    return exported


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names the code binds anywhere: assignments, imports, definitions, arguments,
    exception names; names it reads)."""
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, loaded


def _is_future_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"
