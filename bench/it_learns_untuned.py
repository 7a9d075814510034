"""The learning protocol on environments nobody tuned it on, with format told from content.

    python bench/it_learns_untuned.py [ENV ...] [--out FILE]

Runs `tests/e2e/test_it_learns.py` (the real model, vLLM on the CPU, real workers; three GRPO
steps, 128 held-out instances before and after) once per environment, each at its easiest
level (`min_difficulty`), through the test's `IT_LEARNS_ENV` and `IT_LEARNS_DIFFICULTY`; by
default on `longest_increasing_subsequence`, `count_connected_components` and
`knapsack_max_value`, seeds the protocol was not chosen on. Each run's `it-learns:` line is kept
whether the test's gate passed or not (on an untuned environment it may well fail: that is a
result too), and one Markdown table is printed (and written to FILE): strict and lenient pass
rates before and after, their paired counts and sign tests, the best constant answer, the
format errors, the gate, the seconds, with the CPU it ran on and the command; a run that ended
without its line (the test's own time limit) is a row saying so. `--from-logs` prints the table
again from the logs of earlier runs. Not part of CI:
each run starts its own cluster and takes 15 to 25 minutes on two cores (docs/results.md).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchkit import load_environment  # noqa: E402

from shared.hardware import cpu_flags, cpu_model_name, describe, native_bf16  # noqa: E402

ENVIRONMENTS = (
    "longest_increasing_subsequence",
    "count_connected_components",
    "knapsack_max_value",
)
TEST = "tests/e2e/test_it_learns.py"
TEST_SECONDS = 2400
"""The test's own time limit in these runs (`IT_LEARNS_TIMEOUT`; 1,500 s in CI): a seed with
longer prompts (knapsack_max_value) ran past 1,500 s on a CPU without bfloat16."""
RUN_SECONDS = TEST_SECONDS + 300
"""Longest one run may take (the test's limit, the cluster's start beside)."""
FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)")


def parse_line(line: str) -> dict[str, str]:
    """The `it-learns:` line's fields by name (a quoted answer keeps its quotes)."""
    return dict(FIELD.findall(line.removeprefix("it-learns:")))


def run_one(env: str, logs: Path) -> tuple[dict[str, str], bool, float]:
    """The protocol on `env` at its easiest level: the line's fields, whether the test passed,
    and the seconds it took (the cluster's start included)."""
    difficulty = load_environment(REPO / "seeds" / f"{env}.py", f"seed_{env}").min_difficulty
    command = [sys.executable, "-m", "pytest", TEST, "-q"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            env={
                **os.environ,
                "IT_LEARNS_ENV": env,
                "IT_LEARNS_DIFFICULTY": str(difficulty),
                "IT_LEARNS_TIMEOUT": str(TEST_SECONDS),
            },
            capture_output=True,
            text=True,
            timeout=RUN_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as late:
        output = _text(late.stdout) + _text(late.stderr)
        (logs / f"{env}.log").write_text(output)
        row = {"env": env, "difficulty": str(difficulty), "missing": f"past {RUN_SECONDS:,} s"}
        return row, False, time.monotonic() - started
    seconds = time.monotonic() - started
    (logs / f"{env}.log").write_text(done.stdout + done.stderr)
    return read_log(env, difficulty, done.stdout + done.stderr, done.returncode == 0, seconds)


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def read_log(
    env: str, difficulty: int, text: str, passed: bool, seconds: float
) -> tuple[dict[str, str], bool, float]:
    """One run's row from its output: the `it-learns:` line's fields, or, when the run ended
    without one, the environment and why (`missing`)."""
    lines = [line for line in text.splitlines() if line.startswith("it-learns:")]
    if lines:
        return parse_line(lines[-1]), passed, seconds
    limit = re.search(r"Timeout \(>([\d.]+)s\)", text)
    why = f"timed out at the test's {float(limit[1]):,.0f} s" if limit else "no it-learns line"
    return {"env": env, "difficulty": str(difficulty), "missing": why}, passed, seconds


def from_logs(envs: list[str], logs: Path) -> list[tuple[dict[str, str], bool, float]]:
    """The rows of earlier runs, read again from their logs (`--from-logs`)."""
    rows = []
    for env in envs:
        text = (logs / f"{env}.log").read_text()
        summary = re.findall(r"(\d+) (passed|failed) in ([\d.]+)s", text)
        passed = bool(summary) and summary[-1][1] == "passed"
        seconds = float(summary[-1][2]) if summary else float("nan")
        difficulty = load_environment(REPO / "seeds" / f"{env}.py", f"seed_{env}").min_difficulty
        rows.append(read_log(env, difficulty, text, passed, seconds))
    return rows


def table(rows: list[tuple[dict[str, str], bool, float]], command: str) -> str:
    """The one Markdown table, with the CPU and the command under it."""
    out = [
        "| environment, difficulty | strict before → after | lenient before → after | b, c "
        "(p) | b_lenient, c_lenient (p) | best constant | format errors | gate | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f, passed, seconds in rows:
        if "missing" in f:
            empty = " | ".join("–" for _ in range(6))
            out.append(
                f"| {f['env']}, {f['difficulty']} | {f['missing']} | {empty} | failed "
                f"| {seconds:,.0f} |"
            )
            continue
        out.append(
            f"| {f['env']}, {f['difficulty']} | {f['before']} → {f['after']} "
            f"| {f['lenient_before']} → {f['lenient_after']} | {f['b']}, {f['c']} ({f['p']}) "
            f"| {f['b_lenient']}, {f['c_lenient']} ({f['p_lenient']}) "
            f"| {f['best_constant']} ({f['answer']}) "
            f"| {f['fmt_err_before']} → {f['fmt_err_after']} | {'passed' if passed else 'failed'} "
            f"| {seconds:,.0f} |"
        )
    flags = cpu_flags()
    cpu = f"{cpu_model_name()}, {os.cpu_count()} cores, " + describe(
        "bfloat16" if native_bf16(flags) else "float32", gpu=False, flags=flags, given=None
    )
    return "\n".join([*out, "", f"CPU: {cpu}. Command: `{command}`."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="*", default=list(ENVIRONMENTS), help="seed names")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "it_learns_untuned.md")
    parser.add_argument(
        "--from-logs", action="store_true", help="the table from the runs' logs, run nothing"
    )
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.with_suffix("")
    logs.mkdir(exist_ok=True)
    if args.from_logs:
        rows = from_logs(args.envs, logs)
    else:
        rows = []
        for env in args.envs:
            rows.append(run_one(env, logs))
            print(f"{env}: done in {rows[-1][2]:,.0f} s", flush=True)
    command = " ".join(["python bench/it_learns_untuned.py", *sys.argv[1:]])
    text = table(rows, command)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
