"""Helpers of the queue tests: real worker subprocesses, a cluster of them, job payloads.

Every worker is a real `evoenv worker` process tree (`main` of `evoenv_cli` run by this
interpreter), started in its own session with its settings in `EVOENV_*` variables, waited on
until it answers `inspect().active_queues()`, and killed with every descendant when the cluster
stops (its sandboxes run in sessions of their own, so the tree is walked through /proc, not the
process group). A cluster's workers share one data folder, hence one SQLite archive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import missing

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from evoenv_cli import main; main()"]
READY_SECONDS = 60.0


def require_sandbox() -> None:
    """Workers run environment code in the confined sandbox: it must work on this machine."""
    from evoenv_worker.sandbox.launch import missing_isolation

    problems = missing_isolation()
    if problems:
        missing("confined sandbox unavailable: " + "; ".join(problems))


# --------------------------------------------------------------------------------- processes


def _parents() -> dict[int, int]:
    table: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        table[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return table


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def kill_tree(root: int, proc: subprocess.Popen[bytes] | None = None) -> list[int]:
    """SIGKILL `root` and everything below it; returns the pids that were killed."""
    pids = [root, *descendants(root)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc is not None:
        proc.wait(10)
    return pids


def wait_gone(pids: Sequence[int], seconds: float = 10.0) -> list[int]:
    """Wait for `pids` to end; returns those still alive after `seconds`."""
    deadline = time.monotonic() + seconds
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def wait_for(check: Callable[[], Any], seconds: float, what: str, every: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(every)


# ----------------------------------------------------------------------------------- workers


@dataclass
class Service:
    """A process tree started by a test (a worker, Flower, a Redis), its output in `log`."""

    proc: subprocess.Popen[bytes]
    log: Path
    killed: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> list[int]:
        """kill -9 the process and every process below it; returns every pid ever killed."""
        if self.proc.poll() is None or descendants(self.pid):
            self.killed += kill_tree(self.pid, self.proc)
        return self.killed

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON lines of the log (structlog events)."""
        events = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events


def spawn(command: Sequence[str], env: dict[str, str], log: Path) -> Service:
    """Start `command` in a session of its own, stdout and stderr to `log`."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            list(command),
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Service(proc, log)


@dataclass
class Worker(Service):
    """One `evoenv worker` process tree."""

    prefix: str = ""
    """The node name up to the '@' (the host part is filled in by Celery)."""
    queues: tuple[str, ...] = ()
    node: str = ""
    """The full node name, known once the worker answered."""


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without its EVOENV_* variables, plus `settings`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    return {**base, "PYTHONUNBUFFERED": "1", **settings}


class Cluster:
    """A module's Redis, data folder, Celery client app and the workers started on them."""

    def __init__(self, redis_url: str, data_dir: Path, app: Any, env: dict[str, str]) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.app = app
        self.env = {
            "EVOENV_REDIS_URL": redis_url,
            "EVOENV_DATA_DIR": str(data_dir),
            "EVOENV_DATABASE_URL": "",
            "EVOENV_LOG_FORMAT": "json",
            "EVOENV_LOG_LEVEL": "INFO",
            **env,
        }
        self.workers: list[Worker] = []

    def worker_env(self, **overrides: str) -> dict[str, str]:
        """The environment of a worker (or a CLI run): EVOENV_* pointing at this cluster."""
        return clean_env(**self.env, **overrides)

    def start_worker(
        self,
        queues: Sequence[str],
        concurrency: int = 2,
        wait: bool = True,
        pool: str | None = None,
        **env: str,
    ) -> Worker:
        prefix = f"{'-'.join(queues)}-{uuid.uuid4().hex[:6]}"
        command = [
            *CLI,
            "worker",
            "-Q",
            ",".join(queues),
            "-c",
            str(concurrency),
            "--name",
            f"{prefix}@%h",
            *(["--pool", pool] if pool else []),
        ]
        service = spawn(command, self.worker_env(**env), self.data_dir / f"worker-{prefix}.log")
        worker = Worker(service.proc, service.log, prefix=prefix, queues=tuple(queues))
        self.workers.append(worker)
        if wait:
            self.wait_ready(worker)
        return worker

    def wait_ready(self, worker: Worker) -> None:
        """Wait until `worker` answers `active_queues()` with its queues."""

        def answered() -> str | None:
            if worker.proc.poll() is not None:
                pytest.fail(
                    f"worker exited ({worker.proc.returncode}):\n{worker.log_text()[-3000:]}"
                )
            replies = self.app.control.inspect(timeout=0.5).active_queues() or {}
            for node, queues in replies.items():
                if node.startswith(worker.prefix + "@"):
                    assert sorted(q["name"] for q in queues) == sorted(worker.queues)
                    return node
            return None

        worker.node = wait_for(answered, READY_SECONDS, f"worker {worker.prefix} to answer", 0.2)

    def active(self, worker: Worker, timeout: float = 1.0) -> list[dict[str, Any]]:
        """The jobs `worker` is running now (each with `id`, `name` and `worker_pid`)."""
        reply = self.app.control.inspect(destination=[worker.node], timeout=timeout, limit=1)
        return (reply.active() or {}).get(worker.node, [])

    def stop(self) -> None:
        """Kill every worker this cluster started, and check that no process of theirs is left."""
        killed: list[int] = []
        for worker in self.workers:
            killed += worker.kill()
        left = wait_gone(killed)
        assert not left, f"processes left behind by the workers: {left}"


def flush(url: str) -> None:
    """Empty every database of the Redis at `url`."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()


# ------------------------------------------------------------------------------ job payloads


SLOW_ENV = """
import random

from shared.environment import Environment


def spin(rounds: int) -> int:
    total = 0
    for k in range(rounds):
        total = (total * 31 + k) % 1_000_003
    return total


class SlowSum(Environment):
    name = "slow_sum"
    description = "Add two numbers, slowly."
    oracle = "equality"
    min_difficulty = 1
    max_difficulty = 5

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"a": rng.randint(0, 10 ** (difficulty + 2)), "b": rng.randint(0, 10 ** (difficulty + 2))}

    def solve(self, instance: dict) -> int:
        spin(SOLVE_ROUNDS)
        return instance["a"] + instance["b"]

    def render(self, instance: dict) -> str:
        return f"What is {instance['a']} + {instance['b']}? Answer with the number."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        if answer.strip() == "slow":
            spin(SCORE_ROUNDS)
        return 1.0 if answer.strip() == str(reference) else 0.0
"""
"""An environment whose `solve` (every call) and `score` (of the answer "slow") burn CPU."""


def slow_env(solve_rounds: int, score_rounds: int) -> str:
    return SLOW_ENV.replace("SOLVE_ROUNDS", str(solve_rounds)).replace(
        "SCORE_ROUNDS", str(score_rounds)
    )


def solver_job(
    source: str,
    answers: Sequence[str],
    *,
    run: str = "default",
    name: str = "env",
    seed: int = 0,
    difficulty: int = 1,
    group_id: str | None = None,
) -> dict[str, Any]:
    """The JSON payload of a `grade` job (one completion per answer, tagged with versions)."""
    from shared.db import source_sha
    from shared.messages import CompletionRecord, EnvRef, SolverJob

    completions = [
        CompletionRecord(
            text=f"<answer>{a}</answer>",
            token_ids=[1, 2],
            logprobs=[-0.1, -0.2],
            policy_version=3 + i,
        )
        for i, a in enumerate(answers)
    ]
    job = SolverJob(
        run=run,
        group_id=group_id or uuid.uuid4().hex,
        env=EnvRef(name=name, sha=source_sha(source), source=source),
        seed=seed,
        difficulty=difficulty,
        group_size=max(len(answers), 1),
        prompt="(prompt)",
        completions=completions,
    )
    return job.model_dump(mode="json")


def validate_job(
    source: str, file: str = "candidate.py", job_id: str | None = None
) -> dict[str, Any]:
    from shared.messages import ValidateJob

    job = ValidateJob(job_id=job_id or str(uuid.uuid4()), file=file, source=source)
    return job.model_dump(mode="json")


def stream_groups(url: str, run: str) -> list[dict[str, Any]]:
    """Every graded group on the rollout stream of `run`."""
    import redis

    from shared import keys

    client = redis.Redis.from_url(url)
    try:
        entries = client.xrange(keys.rollout_stream(run))
    finally:
        client.close()
    return [json.loads(fields[b"group"]) for _, fields in entries]


def archive_rows(
    data_dir: Path, table: str, where: str = "", *params: Any
) -> list[tuple[Any, ...]]:
    """Rows of a table of the cluster's SQLite archive (read-only, plain sqlite3)."""
    import sqlite3

    path = data_dir / "archive.db"
    if not path.exists():
        return []  # no worker has written to the archive yet
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return connection.execute(f"SELECT * FROM {table} {where}", params).fetchall()
    finally:
        connection.close()


def run_cli(
    *args: str | Path, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """`evoenv ARGS` in a real subprocess with the given environment (which must name its
    Redis: the default is a shared one)."""
    assert "EVOENV_REDIS_URL" in env, "a test must never talk to the default Redis"
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )
