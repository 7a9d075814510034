"""The second solve: the reviewer writes `solve` again from the problem as a solver reads it
(the rendered prompt, the instance's fields, the answer's form; never the candidate's code or
reference), and the candidate's own scorer grades what that `solve` answers on fresh instances
at three difficulties. A question that does not ask what `solve` computes fails it
(docs/CONTRACT.md#review)."""

from __future__ import annotations

import ast
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evoenv_worker.grade import grade_op, read_grades
from evoenv_worker.proposal_code import written_code
from evoenv_worker.review import clip
from shared.inference import InferenceClient, Sampling
from shared.messages import Trace
from shared.static import check_static

if TYPE_CHECKING:
    from evoenv_worker.sandbox.host import Sandbox

SEEDS = (101, 102, 103)
"""Seeds of the instances each second solve answers, at the min, middle and max difficulty."""
RENAMED = "second_solve"
"""What the written `solve` is called inside the spliced file (the candidate keeps its name)."""


def shape(value: Any, depth: int = 0) -> str:
    """The form of a reference in words, without its values: `an int`, `a list of str`,
    `a dict with the keys "min" (an int), "max" (an int)`."""
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a str"
    if isinstance(value, list):
        if not value or depth > 2:
            return "a list"
        return f"a list of {shape(value[0], depth + 1).split(' ', 1)[1]}"
    if isinstance(value, dict) and depth <= 2:
        keys = ", ".join(f'"{k}" ({shape(v, depth + 1)})' for k, v in list(value.items())[:12])
        return f"a dict with the keys {keys}"
    return f"a {type(value).__name__}"


def second_solve_messages(trace: Trace, instance: dict[str, Any]) -> list[dict[str, str]]:
    """The prompt: the problem as rendered, its instance, the answer's form; not the code."""
    fields, prompt = clip(json.dumps(instance), 3000), clip(trace.prompt, 4000)
    user = (
        "A program generated this problem from a Python dict called `instance`.\n\n"
        f"The problem, exactly as it was shown:\n<<<\n{prompt}\n>>>\n\n"
        f"The instance it was generated from, as JSON:\n{fields}\n\n"
        "Write a Python function `solve(instance)` that returns the correct answer to the "
        "problem as it is stated, for any instance of this form (other sizes and values), "
        f"as {shape(trace.reference)}. Use only the standard library. "
        "Answer with one ```python code block."
    )
    return [
        {"role": "system", "content": "You are a careful Python programmer."},
        {"role": "user", "content": user},
    ]


def spliced_source(source: str, reply: str) -> str | None:
    """The candidate's file with its `solve` answering through the reply's `solve(instance)`
    (renamed `second_solve`, with the reply's imports and helpers); None when the reply has no
    top-level `solve` or either file does not parse."""
    try:
        tree = ast.parse(source)
        written = ast.parse(written_code(reply))
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "solve" for n in written.body):
        return None
    for node in ast.walk(written):
        if isinstance(node, ast.FunctionDef) and node.name == "solve":
            node.name = RENAMED
        elif isinstance(node, ast.Name) and node.id == "solve":
            node.id = RENAMED
    method = _solve_method(tree)
    if method is None or len(method.args.args) < 2:
        return None
    argument = method.args.args[1].arg
    call = ast.Call(ast.Name(RENAMED, ast.Load()), [ast.Name(argument, ast.Load())], [])
    method.body = [ast.Return(call)]
    tree.body.extend(written.body)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _solve_method(tree: ast.Module) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "solve":
                    return item
    return None


@dataclass(frozen=True, slots=True)
class SecondSolve:
    ok: bool
    detail: str
    agreements: list[int]
    """Per written solve, how many of the checked instances the candidate's scorer gave 1.0."""
    instances: int
    seconds: float

    def data(self) -> dict[str, Any]:
        return {"agreements": self.agreements, "instances": self.instances}


def second_solve(
    client: InferenceClient,
    sandbox: Sandbox,
    source: str,
    filename: str,
    trace: Trace,
    sampling: Sampling,
    difficulties: tuple[int, int],
    max_bytes: int = 64 * 1024,
) -> SecondSolve:
    """`sampling.n` second solves of the candidate; it passes when one of them answers every
    checked instance (SEEDS at the min, middle and max of `difficulties`) as the candidate's
    scorer accepts; a spliced file must pass L1's static check within `max_bytes`. A request that
    fails raises (the stage could not run)."""
    started = time.perf_counter()
    (traced,) = sandbox.run(
        source,
        [{"op": "instance", "seed": trace.seed, "difficulty": trace.difficulty}],
        filename=filename,
    )
    if not traced.ok:
        return SecondSolve(False, f"the traced instance failed: {traced.reason}", [], 0, 0.0)
    replies = client.chat(second_solve_messages(trace, traced.value["instance"]), sampling)
    lo, hi = difficulties
    points = [(s, d) for d in sorted({lo, (lo + hi) // 2, hi}) for s in SEEDS]
    agreements = [_agreement(sandbox, source, filename, c.text, points, max_bytes) for c in replies]
    best = max(agreements, default=0)
    ok = best == len(points)
    detail = (
        f"a second solve written from the prompt agreed with solve on {best} of {len(points)} "
        f"instances (best of {len(agreements)})"
    )
    if not ok:
        detail += ": the prompt may not ask what solve computes"
    seconds = round(time.perf_counter() - started, 3)
    return SecondSolve(ok, detail, agreements, len(points), seconds)


def _agreement(
    sandbox: Sandbox,
    source: str,
    filename: str,
    reply: str,
    points: list[tuple[int, int]],
    max_bytes: int,
) -> int:
    """How many of `points` the reply's solve answers as the candidate's scorer accepts; 0 when
    the spliced file is not a file L1 admits."""
    spliced = spliced_source(source, reply)
    if spliced is None or not check_static(spliced.encode(), max_bytes).ok:
        return 0
    ops = [{"op": "instance", "seed": s, "difficulty": d} for s, d in points]
    written = sandbox.run(spliced, ops, filename=filename)
    answers = [r.value["answer_text"] if r.ok else None for r in written]
    grading = [grade_op(s, d, [a]) for (s, d), a in zip(points, answers, strict=True) if a]
    if not grading:
        return 0
    graded = sandbox.run(source, grading, filename=filename)
    agreed = 0
    for result, answer in zip(graded, [a for a in answers if a], strict=True):
        grades, _ = read_grades(result, [answer])
        if grades and grades[0] is not None and grades[0].reward == 1.0:
            agreed += 1
    return agreed
