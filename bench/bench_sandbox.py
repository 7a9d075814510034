"""What grading through the confined sandbox costs, beside two baselines, in one run.

    python bench/bench_sandbox.py [--env seeds/sort_words.py] [--answers 1024] [--rounds 9]

Grades groups of 1, 8, 64 and 512 answers to one instance of a seed environment the way
`grade.grade_group` does (regenerate the instance from its seed once, then score every answer),
three ways:

- sandbox: one request per group through the confined fork server: one `grade` op (sample
  and solve once, score every answer, one reply line), sent and read back exactly as
  `grade_group` does (`grade_op`, `grade_op_seconds`, `Sandbox.run`, `read_grades`);
- in-process: the same work called directly in this process, the unsafe lower bound (no
  isolation, no copies, no JSON): sample, solve, render and answer_text once, then score each
  answer;
- fresh process: a new `python` per call doing the same, the group on stdin, the scores as
  JSON on stdout.

Each batch size is measured in `--rounds` rounds, every grader once per round, back to back.
Prints the cost per answer of each (its best round) and two ratios: sandbox over in-process
(target: within 3x at 512) and sandbox throughput over fresh-process throughput (target: at
least 10x at every batch size). A ratio is the median over the rounds of the ratio within a
round: the speed of a shared virtual machine drifts by a third from second to second, so two
graders are compared on the same stretch of time; the ratio of the best rounds, which may come
from different stretches, is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchkit import load_environment  # noqa: E402

from evoenv_worker.grade import grade_op, grade_op_seconds, read_grades  # noqa: E402
from evoenv_worker.sandbox.host import Sandbox  # noqa: E402
from evoenv_worker.sandbox.launch import interpreter  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.environment import Environment, grade_value, make_rng, seed_global_random  # noqa: E402

BATCHES = (1, 8, 64, 512)
SEED, DIFFICULTY = 1, 5
TARGET_IN_PROCESS = 3.0
"""At batches of 512, the sandbox's cost per answer within this factor of in-process."""
TARGET_FRESH = 10.0
"""At every batch size, the sandbox's throughput at least this factor of a fresh process."""

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
seed, difficulty = request["seed"], request["difficulty"]
seed_global_random(cls.name, seed, difficulty)
instance = env.sample(make_rng(cls.name, seed, difficulty), difficulty)
reference = env.solve(instance)
env.render(instance)
env.answer_text(reference)
out = [grade_value(env.score(instance, reference, answer)).reward for answer in request["answers"]]
sys.stdout.write(json.dumps(out))
"""


def make_answers(env: Environment, count: int) -> list[str]:
    """`count` answers to the instance: right ones, wrong ones, near misses."""
    name = type(env).name
    right = env.answer_text(env.solve(env.sample(make_rng(name, SEED, DIFFICULTY), DIFFICULTY)))
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
    """Mean seconds per answer over `calls` groups of `batch` answers."""
    start = time.perf_counter()
    for i in range(calls):
        offset = (i * batch) % (len(answers) - batch + 1)
        grade(answers[offset : offset + batch])
    return (time.perf_counter() - start) / (calls * batch)


def in_process(env: Environment) -> Grader:
    name = type(env).name

    def grade(answers: list[str]) -> list[float | None]:
        seed_global_random(name, SEED, DIFFICULTY)
        instance = env.sample(make_rng(name, SEED, DIFFICULTY), DIFFICULTY)
        reference = env.solve(instance)
        env.render(instance)
        env.answer_text(reference)
        return [grade_value(env.score(instance, reference, a)).reward for a in answers]

    return grade


def through_sandbox(sandbox: Sandbox, source: str, settings: Settings) -> Grader:
    """One `grade` op per group, as `grade.grade_group` sends and reads it."""

    def grade(answers: list[str]) -> list[float | None]:
        batch: list[str | None] = list(answers)
        (result,) = sandbox.run(
            source,
            [grade_op(SEED, DIFFICULTY, batch)],
            filename="environment.py",
            op_seconds=grade_op_seconds(settings, len(batch)),
        )
        grades, reason = read_grades(result, batch)
        if reason:
            raise RuntimeError(f"grading failed: {reason}")
        return [g.reward if g is not None else None for g in grades]

    return grade


def fresh_process(source: str) -> Grader:
    argv = [str(interpreter()), "-s", "-S", "-B", "-c", FRESH_SCRIPT, str(REPO)]

    def grade(answers: list[str]) -> list[float | None]:
        request = {"source": source, "seed": SEED, "difficulty": DIFFICULTY, "answers": answers}
        done = subprocess.run(
            argv,
            input=json.dumps(request).encode(),
            capture_output=True,
            check=True,
            env={"PYTHONHASHSEED": "0"},
        )
        return list(json.loads(done.stdout))

    return grade


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", type=Path, default=REPO / "seeds" / "sort_words.py")
    parser.add_argument("--answers", type=int, default=1024, help="answers per batch size")
    parser.add_argument("--rounds", type=int, default=9, help="rounds, every grader once in each")
    args = parser.parse_args()
    source = args.env.read_text()
    env = load_environment(args.env)
    answers = make_answers(env, max(BATCHES) * 2)
    settings = Settings()
    rows: list[tuple[int, list[list[float]]]] = []
    with Sandbox(settings.sandbox) as sandbox:
        if not sandbox.isolated:
            raise SystemExit("the sandbox is not isolated here; this measures the confined mode")
        local = in_process(env)
        sandboxed, fresh = through_sandbox(sandbox, source, settings), fresh_process(source)
        expected = local(answers[:64])
        if sandboxed(answers[:64]) != expected or fresh(answers[:64]) != expected:
            raise SystemExit("the graders disagree; the timings would mean nothing")
        for batch in BATCHES:
            calls = max(10, args.answers // batch)
            plans = (
                (sandboxed, calls),
                (local, max(calls, 20_000 // batch)),
                (fresh, max(3, min(20, calls // 4))),
            )
            for grader, _ in plans:
                grader(answers[:batch])  # warm up
            rounds = [
                [per_answer(grader, answers, batch, n) for grader, n in plans]
                for _ in range(args.rounds)
            ]
            rows.append((batch, rounds))
    print_table(rows, args.env.name, args.rounds)


def print_table(rows: list[tuple[int, list[list[float]]]], env_name: str, rounds: int) -> None:
    """One row per batch size from its rounds, each [sandbox, in-process, fresh] seconds."""
    print(
        f"grading {env_name} (seed {SEED}, difficulty {DIFFICULTY}): microseconds per answer, "
        f"best of {rounds} rounds (lower is better); ratios: median over the rounds of the "
        "ratio within a round (in brackets: of the best rounds)\n"
    )
    header = (
        "batch",
        "sandbox (grade op)",
        "in-process",
        "fresh python",
        "sandbox/in-process",
        "sandbox vs fresh (throughput)",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for batch, measured in rows:
        sandbox, local, fresh = (min(column) for column in zip(*measured, strict=True))
        slow = statistics.median(s / inside for s, inside, _ in measured)
        fast = statistics.median(f / s for s, _, f in measured)
        slow_mark = (" ok" if slow <= TARGET_IN_PROCESS else " MISS") if batch == 512 else ""
        fast_mark = " ok" if fast >= TARGET_FRESH else " MISS"
        cells = (
            str(batch),
            f"{sandbox * 1e6:,.1f}",
            f"{local * 1e6:,.2f}",
            f"{fresh * 1e6:,.1f}",
            f"{slow:,.1f}x{slow_mark} ({sandbox / local:,.1f}x)",
            f"{fast:,.1f}x{fast_mark} ({fresh / sandbox:,.1f}x)",
        )
        print("| " + " | ".join(cells) + " |")
    print(
        f"\ntargets: sandbox/in-process <= {TARGET_IN_PROCESS:g}x at 512; "
        f"sandbox vs fresh >= {TARGET_FRESH:g}x at every batch"
    )


if __name__ == "__main__":
    main()
