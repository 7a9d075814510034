"""The proposal prompt: a few pool members as complete example files, the contract in brief,
and the request for one new environment file (about a named task, if asked). Built by the
learner's orchestrator; getting the code back out of a response is the workers' business.
"""

from __future__ import annotations

import ast
import random
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
    or 1) above a small floor; a middling weight while the rate is unknown.

    This favours the solver's frontier: members the solver solves sometimes but not always. A
    proposal tends to resemble its examples, and admission wants a pass rate strictly between
    0 and 1 (docs/CONTRACT.md#calibration), so examples the solver never (or always) solves
    mostly breed candidates calibration rejects.
    """
    if example.solve_rate is None:
        return UNKNOWN_WEIGHT
    a = example.solve_rate
    return FLOOR_WEIGHT + (1.0 - FLOOR_WEIGHT) * 4.0 * a * (1.0 - a)


def choose_examples(pool: Sequence[Example], k: int, rng: random.Random) -> list[Example]:
    """Up to `k` distinct examples drawn without replacement with `example_weight`, a kind
    already drawn weighing `SAME_KIND_FACTOR` as much."""
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


SYSTEM = "You write Python reinforcement-learning environments."
"""The system message of every proposal prompt."""
REPLY_FORMAT = "Reply with the complete file in a single ```python code block and nothing else."


def examples_text(examples: Sequence[Example]) -> str:
    """The example files as a proposal prompt shows them, helpers above the class."""
    return "\n\n".join(
        f"Example {i + 1} ({e.oracle} oracle), file {e.name}.py:\n"
        f"```python\n{helpers_first(e.source).strip()}\n```"
        for i, e in enumerate(examples)
    )


def proposal_messages(examples: Sequence[Example], topic: str = "") -> list[dict[str, str]]:
    """The chat messages asking for one new environment file (about `topic`, if given): the
    `topic` proposal mode, today's prompt."""
    shown = examples_text(examples)
    names = ", ".join(e.name for e in examples)
    task = (
        f"Its task: {topic}."
        if topic
        else "Pick a new algorithmic task whose reference answer code computes exactly."
    )
    user = (
        f"{CONTRACT_BRIEF}\n{shown}\n\n"
        f"Write ONE new environment file for a different problem than the examples ({names}). "
        f'{task} The oracle attribute is only "equality" or "feasibility". {REPLY_FORMAT}'
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
