"""What grading through the confined sandbox costs, beside two baselines, in one run.

    python bench/bench_sandbox.py [--env seeds/sort_words.py] [--answers 1024]

Grades groups of 1, 8, 64 and 512 answers to one instance of a seed environment the way
`grade.grade_group` does (one call: regenerate the instance from its seed, then score every
answer), three ways:

- sandbox: one request per group through the confined fork server (`Sandbox.run`: one
  `instance` op, then one `score` op per answer with `"from": 0`);
- in-process: the same work called directly in this process, the unsafe lower bound (no
  isolation, no copies, no JSON);
- fresh process: a new `python` per call, the group on stdin, the scores as JSON on stdout.

Prints the cost per answer of each and two ratios: sandbox over in-process (target: within 3x
at 512) and sandbox throughput over fresh-process throughput (target: at least 10x).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evoenv_worker.sandbox.host import Sandbox  # noqa: E402
from evoenv_worker.sandbox.launch import interpreter  # noqa: E402
from shared.config import SandboxSettings  # noqa: E402
from shared.environment import Environment, grade_value, make_rng, seed_global_random  # noqa: E402

BATCHES = (1, 8, 64, 512)

FRESH_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from shared.environment import Environment, grade_value
from shared.environment import make_rng, seed_global_random
request = json.loads(sys.stdin.read())
module = {"__name__": "candidate"}
exec(compile(request["source"], "environment.py", "exec"), module)
[cls] = [v for v in module.values() if isinstance(v, type) and issubclass(v, Environment)
         and v is not Environment]
env = cls()
seed_global_random(cls.name, 1, 5)
instance = env.sample(make_rng(cls.name, 1, 5), 5)
reference = env.solve(instance)
out = [grade_value(env.score(instance, reference, answer)).reward for answer in request["answers"]]
sys.stdout.write(json.dumps(out))
"""


def load(path: Path) -> Environment:
    spec = importlib.util.spec_from_file_location("bench_candidate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    [cls] = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Environment) and v is not Environment
    ]
    return cls()


def make_answers(env: Environment, count: int) -> list[str]:
    """`count` answers to instance (seed 1, difficulty 5): right ones, wrong ones, near misses."""
    name = type(env).name
    right = env.answer_text(env.solve(env.sample(make_rng(name, 1, 5), 5)))
    rng = random.Random(0)
    answers = []
    for i in range(count):
        if i % 3 == 0:
            answers.append(right)
        elif i % 3 == 1:
            answers.append(str(rng.random()))
        else:
            chars = list(right)
            rng.shuffle(chars)
            answers.append("".join(chars))
    return answers


Grader = Callable[[list[str]], list[float | None]]


def per_answer(grade: Grader, answers: list[str], batch: int, calls: int) -> float:
    """Mean seconds per answer over `calls` groups of `batch` answers (after one warm-up)."""
    grade(answers[:batch])
    start = time.perf_counter()
    for i in range(calls):
        offset = (i * batch) % (len(answers) - batch + 1)
        grade(answers[offset : offset + batch])
    return (time.perf_counter() - start) / (calls * batch)


def in_process(env: Environment) -> Grader:
    name = type(env).name

    def grade(answers: list[str]) -> list[float | None]:
        seed_global_random(name, 1, 5)
        instance = env.sample(make_rng(name, 1, 5), 5)
        reference = env.solve(instance)
        env.render(instance)
        env.answer_text(reference)
        return [grade_value(env.score(instance, reference, a)).reward for a in answers]

    return grade


def through_sandbox(sandbox: Sandbox, source: str) -> Grader:
    def grade(answers: list[str]) -> list[float | None]:
        ops = [{"op": "instance", "seed": 1, "difficulty": 5}]
        ops += [{"op": "score", "from": 0, "answer": a} for a in answers]
        results = sandbox.run(source, ops)
        if not all(r.ok for r in results):
            raise RuntimeError(f"grading failed: {next(r for r in results if not r.ok)}")
        return [grade_value(r.value).reward for r in results[1:]]

    return grade


def fresh_process(source: str) -> Grader:
    argv = [str(interpreter()), "-s", "-S", "-B", "-c", FRESH_SCRIPT, str(REPO)]

    def grade(answers: list[str]) -> list[float | None]:
        request = json.dumps({"source": source, "answers": answers}).encode()
        done = subprocess.run(
            argv, input=request, capture_output=True, check=True, env={"PYTHONHASHSEED": "0"}
        )
        return list(json.loads(done.stdout))

    return grade


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", type=Path, default=REPO / "seeds" / "sort_words.py")
    parser.add_argument("--answers", type=int, default=1024, help="answers per batch size")
    args = parser.parse_args()
    source = args.env.read_text()
    env = load(args.env)
    answers = make_answers(env, max(BATCHES) * 2)
    rows = []
    with Sandbox(SandboxSettings()) as sandbox:
        if not sandbox.isolated:
            raise SystemExit("the sandbox is not isolated here; this measures the confined mode")
        local = in_process(env)
        sandboxed, fresh = through_sandbox(sandbox, source), fresh_process(source)
        expected = local(answers[:64])
        if sandboxed(answers[:64]) != expected or fresh(answers[:64]) != expected:
            raise SystemExit("the graders disagree; the timings would mean nothing")
        for batch in BATCHES:
            calls = max(10, args.answers // batch)
            sandbox_s = per_answer(sandboxed, answers, batch, calls)
            local_s = per_answer(local, answers, batch, max(calls, 20_000 // batch))
            fresh_s = per_answer(fresh, answers, batch, max(5, calls // 4))
            rows.append((batch, sandbox_s, local_s, fresh_s))
    print_table(rows, args.env.name)


def print_table(rows: list[tuple[int, float, float, float]], env_name: str) -> None:
    print(f"grading {env_name}: microseconds per answer (lower is better)\n")
    header = (
        "batch",
        "sandbox",
        "in-process",
        "fresh python",
        "sandbox/in-process",
        "sandbox vs fresh (throughput)",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for batch, sandbox, local, fresh in rows:
        cells = (
            str(batch),
            f"{sandbox * 1e6:,.1f}",
            f"{local * 1e6:,.2f}",
            f"{fresh * 1e6:,.1f}",
            f"{sandbox / local:,.1f}x",
            f"{fresh / sandbox:,.1f}x",
        )
        print("| " + " | ".join(cells) + " |")
    print("\ntargets: sandbox/in-process <= 3x at 512; sandbox vs fresh >= 10x at every batch")


if __name__ == "__main__":
    main()
