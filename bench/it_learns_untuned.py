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
format errors, the gate, the seconds, with the CPU it ran on and the command. Not part of CI:
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
RUN_SECONDS = 2400
"""Longest one run may take (the test's own timeout is 1,500 s, the cluster's start beside)."""
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
    done = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "IT_LEARNS_ENV": env, "IT_LEARNS_DIFFICULTY": str(difficulty)},
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )
    seconds = time.monotonic() - started
    (logs / f"{env}.log").write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("it-learns:")]
    if not lines:
        raise RuntimeError(f"{env}: no it-learns line (see {logs / f'{env}.log'})")
    return parse_line(lines[-1]), done.returncode == 0, seconds


def table(rows: list[tuple[dict[str, str], bool, float]], command: str) -> str:
    """The one Markdown table, with the CPU and the command under it."""
    out = [
        "| environment, difficulty | strict before → after | lenient before → after | b, c "
        "(p) | b_lenient, c_lenient (p) | best constant | format errors | gate | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f, passed, seconds in rows:
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
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.with_suffix("")
    logs.mkdir(exist_ok=True)
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
