"""What the queue path costs on top of the sandbox, in one run.

    python bench/bench_queue.py [--env seeds/sort_words.py] [--groups 120] [--group-size 8]

Starts a private Redis (append-only, fsync always as deploy/redis.sh, or --appendfsync
everysec) and two real workers:
one of concurrency 2 on `grading`, one of concurrency 1 on `validation`. Then:

- grading throughput: graded answers per second through the full path (submit `grade` jobs,
  the worker regenerates the instance and scores the group in its sandbox, appends the graded
  group to the rollout stream, stores the result) beside the same grading done by direct
  `grade_group` calls (one `Sandbox.run` per group with the same ops) in this process, with one
  sandbox and with two in two threads (the worker's concurrency); the ratio is queue over
  direct with two;
- validation round trip: p50/p95 from submitting one `validate` job to having its report, one
  job at a time, beside validating the same file in this process.

Prints a table. Everything it starts is killed at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402
from benchkit import start_process  # noqa: E402

from evoenv_worker.grade import grade_group  # noqa: E402
from evoenv_worker.mechanical import validate_source  # noqa: E402
from evoenv_worker.sandbox.host import Sandbox  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.db import source_sha  # noqa: E402
from shared.logging import configure_logging  # noqa: E402
from shared.messages import CompletionRecord, EnvRef, SolverJob  # noqa: E402
from shared.ports import free_port  # noqa: E402

CLI = [sys.executable, "-c", "from evoenv_cli import main; main()"]


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process and everything below it (sandboxes run in sessions of their own)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    pids, queue = [proc.pid], [proc.pid]
    while queue:
        children = parents.get(queue.pop(), [])
        pids += children
        queue += children
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def solver_jobs(
    source: str, name: str, run: str, groups: int, size: int, sandbox: Sandbox
) -> list[SolverJob]:
    """`groups` jobs over different seeds, each with `size` answers: half right, half wrong."""
    env = EnvRef(name=name, sha=source_sha(source), source=source)
    ops = [{"op": "instance", "seed": seed, "difficulty": 5} for seed in range(groups)]
    jobs = []
    for seed, result in enumerate(sandbox.run(source, ops, filename=f"{name}.py")):
        assert result.ok, result.reason
        right = result.value["answer_text"]
        texts = [right if i % 2 == 0 else f"{right} and more" for i in range(size)]
        completions = [
            CompletionRecord(text=f"<answer>{t}</answer>", policy_version=1) for t in texts
        ]
        jobs.append(
            SolverJob(
                run=run,
                group_id=uuid.uuid4().hex,
                env=env,
                seed=seed,
                difficulty=5,
                group_size=size,
                prompt="",
                completions=completions,
            )
        )
    return jobs


def direct(jobs: list[SolverJob], settings: Settings, sandboxes: list[Sandbox]) -> float:
    """Seconds to grade every job with direct `grade_group` calls, one thread per sandbox."""
    shares = [jobs[i :: len(sandboxes)] for i in range(len(sandboxes))]

    def grade(share: list[SolverJob], sandbox: Sandbox) -> None:
        for job in share:
            grade_group(sandbox, job, settings)

    threads = [
        threading.Thread(target=grade, args=pair) for pair in zip(shares, sandboxes, strict=True)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", type=Path, default=REPO / "seeds" / "sort_words.py")
    parser.add_argument("--groups", type=int, default=120)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--validations", type=int, default=20)
    parser.add_argument(
        "--appendfsync",
        choices=["always", "everysec"],
        default="always",
        help="Redis append-only fsync policy (deploy/redis.sh's default: always)",
    )
    args = parser.parse_args()
    configure_logging("console", "WARNING")

    folder = Path(tempfile.mkdtemp(prefix="bench_queue_"))
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    env.update(
        EVOENV_REDIS_URL=url,
        EVOENV_DATA_DIR=str(folder / "data"),
        EVOENV_LOG_LEVEL="WARNING",
        EVOENV_LOG_FORMAT="json",
    )
    processes = []
    try:
        redis_proc = start_process(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                args.appendfsync,
                "--save",
                "",
            ],
            env,
            folder / "redis.log",
        )
        processes.append(redis_proc)
        client = redis.Redis.from_url(url)
        wait_until(lambda: _pings(client), 10, "redis-server")
        processes.append(
            start_process(
                [*CLI, "worker", "-Q", "grading", "-c", "2", "-n", "bench-grading@%h"],
                env,
                folder / "grading.log",
            )
        )
        processes.append(
            start_process(
                [*CLI, "worker", "-Q", "validation", "-c", "1", "-n", "bench-validation@%h"],
                env,
                folder / "validation.log",
            )
        )

        from evoenv_worker import tasks
        from evoenv_worker.app import configure
        from shared import keys

        settings = Settings(redis_url=url, data_dir=folder / "client")
        app = configure(settings)

        def workers_up() -> bool:
            replies = app.control.inspect(timeout=0.5).active_queues() or {}
            return len(replies) == 2

        wait_until(workers_up, 60, "the workers")
        source = args.env.read_text()
        name = args.env.stem
        answers = args.groups * args.group_size

        with Sandbox(settings.sandbox) as one, Sandbox(settings.sandbox) as two:
            warm = solver_jobs(source, name, "warmup", 8, args.group_size, one)
            direct(warm, settings, [one, two])
            jobs = solver_jobs(source, name, "bench", args.groups, args.group_size, one)
            direct_one = direct(jobs, settings, [one])
            direct_two = direct(jobs, settings, [one, two])

            # Warm the worker's two pool processes (their sandboxes start on first use).
            for result in [tasks.grade.delay(j.model_dump(mode="json")) for j in warm]:
                result.get(timeout=120)
            started = time.perf_counter()
            results = [tasks.grade.delay(j.model_dump(mode="json")) for j in jobs]
            for result in results:
                result.get(timeout=600)
            queued = time.perf_counter() - started
            assert client.xlen(keys.rollout_stream("bench")) == args.groups

            data = args.env.read_bytes()
            local = []
            for _ in range(max(3, args.validations // 4)):
                t0 = time.perf_counter()
                validate_source(data, name, one, settings)
                local.append(time.perf_counter() - t0)
        trips = []
        payload = {"file": f"{name}.py", "source": source}
        tasks.validate.delay({"job_id": "warm", **payload}).get(timeout=120)
        for i in range(args.validations):
            t0 = time.perf_counter()
            report = tasks.validate.delay({"job_id": f"bench-{i}", **payload}).get(timeout=120)
            trips.append(time.perf_counter() - t0)
            assert report["verdict"] == "admitted", report
    finally:
        for proc in reversed(processes):
            kill_tree(proc)

    best = min(direct_one, direct_two)
    rows = [
        (
            "grading: direct, 1 sandbox",
            f"{answers / direct_one:8.0f} answers/s",
            f"{best / direct_one:.2f}x of best direct",
        ),
        (
            "grading: direct, 2 sandboxes in 2 threads",
            f"{answers / direct_two:8.0f} answers/s",
            f"{best / direct_two:.2f}x of best direct",
        ),
        (
            "grading: queue, 1 worker x 2 processes",
            f"{answers / queued:8.0f} answers/s",
            f"{best / queued:.2f}x of best direct",
        ),
        ("validation: local, p50", f"{statistics.median(local) * 1000:8.0f} ms", ""),
        (
            "validation: queue round trip, p50",
            f"{percentile(trips, 0.5) * 1000:8.0f} ms",
            f"{percentile(trips, 0.5) / statistics.median(local):.2f}x local",
        ),
        (
            "validation: queue round trip, p95",
            f"{percentile(trips, 0.95) * 1000:8.0f} ms",
            f"{percentile(trips, 0.95) / statistics.median(local):.2f}x local",
        ),
    ]
    print(
        f"\n{args.env.name}: {args.groups} groups of {args.group_size} answers "
        f"({answers} answers); {args.validations} validation jobs, one at a time; "
        f"Redis appendfsync {args.appendfsync}; {os.cpu_count()} CPUs"
    )
    width = max(len(r[0]) for r in rows)
    for label, value, ratio in rows:
        print(f"{label:{width}}  {value:>17}  {ratio}")


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


if __name__ == "__main__":
    main()
