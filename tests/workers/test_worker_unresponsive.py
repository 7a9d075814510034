"""`evoenv up` replaces a worker that answers no ping while another does (SIGSTOPped here, a
grading job in hand): it is killed, the supervisor restarts it, and the job it held is given
back and graded once. A worker that answers is left alone."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
import uuid
from typing import Any

import pytest
import redis
from workerkit import CLI, Cluster, slow_env, solver_job, stream_groups

from evoenv_cli import responsive
from evoenv_cli.supervisor import Child, Supervisor, command_pid
from evoenv_cli.up import _worker_died
from evoenv_worker import tasks
from evoenv_worker.broker import answering_pids
from shared import keys

pytestmark = pytest.mark.integration

SLOW = slow_env(solve_rounds=1000, score_rounds=60_000_000)
"""Grading one "slow" answer takes a few seconds: the job is in hand when the worker stops."""
AFTER = 6.0


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any) -> Cluster:
    return cluster_factory(EVOENV_SANDBOX__OP_SECONDS="30", EVOENV_WORKER__GRADE_TIME_LIMIT="60")


def _worker(cluster: Cluster, queue: str) -> Child:
    return Child(
        f"worker-{queue}",
        [*CLI, "worker", "-Q", queue, "-c", "1"],
        cluster.worker_env(),
        cluster.data_dir / f"up-worker-{queue}.log",
        died=functools.partial(_worker_died, cluster.redis_url, queue),
    )


async def _until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {seconds:g} s"
        await asyncio.sleep(0.2)


def test_a_stopped_worker_is_replaced_and_its_job_graded_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(responsive, "EVERY", 1.0)
    monkeypatch.setattr(responsive, "PING_TIMEOUT", 1.0)
    grading, validation = (
        _worker(cluster, keys.GRADING_QUEUE),
        _worker(cluster, keys.VALIDATION_QUEUE),
    )
    supervisor = Supervisor()
    for child in (grading, validation):
        supervisor.add(child)
    said: list[str] = []
    run = f"silent-{uuid.uuid4().hex[:6]}"
    job = solver_job(SLOW, ["slow", "slow", "slow"], run=run, name="slow_sum", seed=1)
    client = redis.Redis.from_url(cluster.redis_url)

    def answering() -> set[int]:
        return answering_pids(cluster.redis_url, 1.0)

    async def scenario() -> str:
        stop = asyncio.Event()
        for child in (grading, validation):
            child.start()

        def pids() -> list[int | None]:
            return [command_pid(c.proc.pid) for c in (grading, validation)]  # type: ignore[union-attr]

        await _until(lambda: set(pids()) <= answering(), 90, "answer from both workers")
        watch = asyncio.create_task(supervisor.watch(stop))
        pinger = asyncio.create_task(
            responsive.replace_silent(
                [grading, validation], cluster.redis_url, AFTER, command_pid, said.append
            )
        )
        try:
            await asyncio.sleep(3 * AFTER)  # both answer: neither is touched
            assert not said and grading.restarts == validation.restarts == 0
            result = tasks.grade.delay(job)
            log = grading.log_path
            await _until(lambda: f"[{result.id}] received" in log.read_text(), 60, "receipt")
            os.killpg(pids()[0], signal.SIGSTOP)  # type: ignore[arg-type]
            stopped = time.monotonic()
            await _until(lambda: grading.restarts == 1 and grading.alive, 60, "restart")
            replaced_after = time.monotonic() - stopped
            graded = await asyncio.to_thread(result.get, timeout=120)
            assert graded["entry"] and not graded["duplicate"]
            assert AFTER <= replaced_after < AFTER + 20, replaced_after
            return str(result.id)
        finally:
            pinger.cancel()
            stop.set()
            await watch

    try:
        task_id = asyncio.run(scenario())
    finally:
        supervisor.stop_all()
    assert said == [f"worker-grading answered no ping for {AFTER:g} s; killed to be restarted"]
    assert validation.restarts == 0
    assert int(client.get(keys.attempts(task_id)) or 0) == 2  # its first delivery and the one after
    (group,) = stream_groups(cluster.redis_url, run)
    assert group["group_id"] == job["group_id"]
    client.close()
