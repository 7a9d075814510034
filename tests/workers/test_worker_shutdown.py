"""How a worker stops (`evoenv_worker/watchdog.py`, docs/DESIGN.md#failure-rules).

- Told to stop while its broker answers: Celery's warm shutdown. The running job finishes, the
  worker exits 0, and the job waiting in the queue is neither run nor lost.
- Told to stop while its broker is gone (Redis killed before the SIGTERM, or just after it): it
  ends within seconds, its pool processes and sandboxes with it, in the middle of a job that
  would otherwise run on for a minute; the job is still unacknowledged in Redis.
- Its parent killed (no signal reaches the worker): it stops by itself.

Each test has a private Redis (append-only, so a killed one comes back with its data) and real
`evoenv worker` processes, prefork with one process as `evoenv up` starts them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from workerkit import (
    CLI,
    Cluster,
    Worker,
    descendants,
    slow_env,
    solver_job,
    spawn,
    wait_for,
    wait_gone,
)

from shared import keys

pytestmark = pytest.mark.integration

STOPPED_WITHIN = 10.0
"""Seconds from the SIGTERM (or the parent's death) until no process of the worker is left."""
LONG = slow_env(solve_rounds=1_000, score_rounds=2_000_000_000)
"""Grading the answer "slow" spins for a minute or more (the sandbox allows it 100 s)."""
SHORT = slow_env(solve_rounds=1_000, score_rounds=150_000_000)
"""Grading "slow" takes a few seconds."""
WORKER_ENV = {"EVOENV_SANDBOX__OP_SECONDS": "100"}


@pytest.fixture
def server(redis_server: Any, tmp_path: Path) -> Iterator[Any]:
    """A private redis-server like the session's (append-only, `appendfsync always`)."""
    private = type(redis_server)(tmp_path / "redis")
    private.folder.mkdir()
    private.start()
    yield private
    private.stop()


@pytest.fixture
def cluster(server: Any, tmp_path: Path) -> Iterator[Cluster]:
    """Workers on the private Redis, and a bare Celery client of it (no result backend: results
    are read from Redis directly)."""
    client = Celery(
        "shutdown-test",
        broker=server.url,
        set_as_current=False,
        config_source={"task_serializer": "json", "accept_content": ["json"]},
    )
    made = Cluster(server.url, tmp_path / "data", client, WORKER_ENV)
    made.data_dir.mkdir()
    yield made
    made.stop()
    client.close()


def _send(cluster: Cluster, source: str, answer: str) -> str:
    job = solver_job(source, [answer], run=f"stop-{uuid.uuid4().hex[:6]}", name="slow_sum")
    sent = cluster.app.send_task("evoenv.grade", args=[job], queue=keys.GRADING_QUEUE)
    return str(sent.id)


def _running_in_sandbox(cluster: Cluster, worker: Worker, task_id: str) -> None:
    """Wait until the job runs (its delivery counted) and its pool process has its sandbox."""
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        wait_for(lambda: client.get(keys.attempts(task_id)), 60, "the job to start", 0.1)
    finally:
        client.close()
    wait_for(lambda: len(descendants(worker.pid)) >= 2, 30, "the job's sandbox", 0.1)


def _group(pgid: int) -> list[int]:
    """Live processes of the process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
                found.append(int(entry.name))
    return found


def _meta(url: str, task_id: str) -> dict[str, Any] | None:
    client = redis.Redis.from_url(url)
    try:
        raw = client.get(f"celery-task-meta-{task_id}")
    finally:
        client.close()
    return None if raw is None else json.loads(raw)


def _held(url: str, task_id: str) -> bool:
    """Whether Redis still holds the job `task_id`: unacknowledged, or back in its queue."""
    client = redis.Redis.from_url(url)
    try:
        entries = [*client.hvals("unacked"), *client.lrange(keys.GRADING_QUEUE, 0, -1)]
    finally:
        client.close()
    return any(task_id.encode() in entry for entry in entries)


def _assert_all_gone(tree: set[int], pgid: int, since: float, log: str) -> float:
    """Every process of `tree` and of group `pgid` ends within `STOPPED_WITHIN` of `since`;
    returns the seconds it took."""
    left = wait_gone(sorted(tree), max(since + STOPPED_WITHIN - time.monotonic(), 0.0))
    seconds = time.monotonic() - since
    assert not left, f"still running {seconds:.1f} s after the stop: {left}\n{log[-3000:]}"
    assert not _group(pgid), f"its process group is not empty: {_group(pgid)}"
    return seconds


@pytest.mark.parametrize("order", ["redis_then_term", "term_then_redis"])
def test_a_stopping_worker_whose_broker_is_gone_ends_within_seconds(
    server: Any, cluster: Cluster, order: str, claim: Any
) -> None:
    worker = cluster.start_worker([keys.GRADING_QUEUE], concurrency=1)
    task_id = _send(cluster, LONG, "slow")
    _running_in_sandbox(cluster, worker, task_id)
    tree = {worker.pid, *descendants(worker.pid)}
    if order == "redis_then_term":
        server.proc.kill()
        server.proc.wait(10)
        time.sleep(1.0)  # the worker has lost its connection and tries to reconnect
    stopped_at = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)
    if order == "term_then_redis":
        time.sleep(0.3)  # its warm shutdown has begun: the job would run on to its end
        server.proc.kill()
        server.proc.wait(10)
    seconds = _assert_all_gone(tree, worker.pid, stopped_at, worker.log_text())
    assert worker.proc.wait(5) == 1
    assert any(e.get("event") == "broker_gone_stopped_now" for e in worker.log_events())
    claim(f"worker stopped {seconds:.1f} s after SIGTERM, its broker gone ({order})")
    server.start()  # the append-only file brings the job back, not acknowledged
    assert _held(server.url, task_id), "the unfinished job was acknowledged"


def test_a_stopping_worker_whose_broker_answers_shuts_down_warmly(
    server: Any, cluster: Cluster
) -> None:
    worker = cluster.start_worker([keys.GRADING_QUEUE], concurrency=1)
    running = _send(cluster, SHORT, "slow")
    _running_in_sandbox(cluster, worker, running)
    waiting = _send(cluster, SHORT, "7")
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.proc.wait(120) == 0
    meta = _meta(server.url, running)
    assert meta is not None and meta["status"] == "SUCCESS", "the running job finished"
    assert _meta(server.url, waiting) is None, "the waiting job did not start"
    assert _held(server.url, waiting), "the waiting job is still in Redis"
    assert not any(e.get("event") == "broker_gone_stopped_now" for e in worker.log_events())
    cluster.start_worker([keys.GRADING_QUEUE], concurrency=1)
    wait_for(
        lambda: (_meta(server.url, waiting) or {}).get("status") == "SUCCESS",
        120,
        "the next worker to run the waiting job",
        0.5,
    )


def test_a_worker_stops_when_its_parent_dies(cluster: Cluster) -> None:
    """The parent starts the worker without any parent-death signal, then is SIGKILLed."""
    prefix = f"orphan-{uuid.uuid4().hex[:6]}"
    worker_argv = [*CLI, "worker", "-Q", keys.GRADING_QUEUE, "-c", "1", "--name", f"{prefix}@%h"]
    parent_code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)"
    parent = spawn(
        [sys.executable, "-c", parent_code, *worker_argv],
        cluster.worker_env(),
        cluster.data_dir / f"worker-{prefix}.log",
    )
    watched = Worker(parent.proc, parent.log, prefix=prefix, queues=(keys.GRADING_QUEUE,))
    cluster.workers.append(watched)  # killed with its tree if the test fails
    cluster.wait_ready(watched)
    tree = set(descendants(parent.pid))
    assert len(tree) >= 2, "the worker and its pool process"
    parent.proc.kill()
    parent.proc.wait(10)
    killed_at = time.monotonic()
    # The parent led the group: what is left of it is the worker's.
    _assert_all_gone(tree, parent.pid, killed_at, parent.log_text())
    assert any(e.get("event") == "parent_gone" for e in parent.log_events())
