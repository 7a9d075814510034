"""kill -9 in the middle of a job: the job is handed out again and completes, and its side
effects happen once (one stream entry per group, one archive row per validation job).

Two ways a worker dies: its pool process (the one running the job) is killed, and the worker's
main process hands the job back at once (`task_reject_on_worker_lost`); or the whole worker is
killed, and the job waits out the visibility timeout before another worker restores it. Time
limits are short here so that the timeout is too.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Any

import pytest
import redis
from workerkit import (
    Cluster,
    Worker,
    archive_rows,
    descendants,
    run_cli,
    slow_env,
    solver_job,
    stream_groups,
    validate_job,
    wait_for,
    wait_gone,
)

from evoenv_worker import tasks
from evoenv_worker.broker import restore_unacknowledged
from shared import keys

pytestmark = pytest.mark.integration

TIME_LIMIT = 15
VISIBILITY = 18
MAX_DELIVERIES = 3
"""One above the two deliveries a killed worker's job needs: Redis's at-least-once delivery may
hand a restored job out once more (seen once in CI), and that must not dead-letter it."""
SLOW = slow_env(solve_rounds=120_000, score_rounds=45_000_000)
"""Validation takes a second or more (every `solve` spins); grading one "slow" answer ~1-2 s."""
QUEUES = [keys.GRADING_QUEUE, keys.VALIDATION_QUEUE]


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any) -> Cluster:
    return cluster_factory(
        EVOENV_WORKER__VALIDATE_TIME_LIMIT=str(TIME_LIMIT),
        EVOENV_WORKER__GRADE_TIME_LIMIT=str(TIME_LIMIT),
        EVOENV_WORKER__COMPLETE_TIME_LIMIT=str(TIME_LIMIT),
        EVOENV_WORKER__VISIBILITY_TIMEOUT=str(VISIBILITY),
        EVOENV_SANDBOX__OP_SECONDS="12",
        EVOENV_WORKER__MAX_DELIVERIES=str(MAX_DELIVERIES),
    )


@pytest.fixture(scope="module")
def first(cluster: Cluster) -> Worker:
    return cluster.start_worker(QUEUES, concurrency=2)


@pytest.fixture(scope="module")
def second(cluster: Cluster) -> Worker:
    return cluster.start_worker(QUEUES, concurrency=2)


@pytest.fixture
def client(cluster: Cluster) -> Any:
    connection = redis.Redis.from_url(cluster.redis_url)
    yield connection
    connection.close()


def _slow_jobs(run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    grade = solver_job(SLOW, ["slow", "slow", "7"], run=run, name="slow_sum", seed=1)
    validate = validate_job(SLOW, "slow_sum.py")
    return grade, validate


def _running(cluster: Cluster, workers: list[Worker], task_ids: set[str]) -> dict[str, Any]:
    """task id -> (worker, pool pid) once every task of `task_ids` is running somewhere."""
    found: dict[str, Any] = {}
    for worker in workers:
        for job in cluster.active(worker):
            if job["id"] in task_ids and job.get("worker_pid"):
                assert job["worker_pid"] in descendants(worker.pid), "a pool process of it"
                found[job["id"]] = (worker, job["worker_pid"])
    return found if set(found) == task_ids else {}


def _in_their_sandboxes(client: Any, running: dict[str, Any]) -> bool:
    """True once every job of `running` (see `_running`) is inside its body, its delivery
    counted by `JobTask`, and its pool process has started its sandbox."""
    return all(
        int(client.get(keys.attempts(task_id)) or 0) == 1 and descendants(pid)
        for task_id, (_worker, pid) in running.items()
    )


def _print_deliveries(workers: list[Worker]) -> None:
    """Each worker's job events (received, ended, lost), for a failure's captured output."""
    for worker in workers:
        for event in worker.log_events():
            text = str(event.get("event", ""))
            if "received" in text or "succeeded" in text or "raised" in text or "consum" in text:
                print(worker.node, event.get("timestamp"), text[:160])


def rows_for(cluster: Cluster, job_id: str) -> list[tuple[Any, ...]]:
    """The archive's validation reports of one job."""
    return archive_rows(cluster.data_dir, "validation_reports", "WHERE job_id = ?", job_id)


def _check_side_effects_once(
    cluster: Cluster, client: Any, run: str, grade: dict[str, Any], validate: dict[str, Any]
) -> None:
    (group,) = stream_groups(cluster.redis_url, run)
    assert group["group_id"] == grade["group_id"]
    assert [c["reward"] for c in group["completions"]] == [0.0, 0.0, 0.0]
    assert len(rows_for(cluster, validate["job_id"])) == 1
    # The same grade job again: nothing new on the stream.
    again = tasks.grade.delay(grade).get(timeout=60)
    assert again["duplicate"] and again["entry"] is None
    assert len(stream_groups(cluster.redis_url, run)) == 1


def test_a_killed_pool_process_has_its_jobs_run_again(
    cluster: Cluster, first: Worker, second: Worker, client: Any
) -> None:
    run = f"pool-kill-{uuid.uuid4().hex[:6]}"
    grade, validate = _slow_jobs(run)
    results = [tasks.grade.delay(grade), tasks.validate.delay(validate)]
    ids = {r.id for r in results}
    running = wait_for(
        lambda: _running(cluster, [first, second], ids), 60, "both jobs to start", every=0.1
    )
    # Inside the sandbox calls; no longer (validation can end within 1.5 s).
    wait_for(lambda: _in_their_sandboxes(client, running), 30, "both sandboxes", every=0.05)
    for result in results:
        assert result.state == "STARTED"
    for _worker, pid in running.values():
        os.kill(pid, signal.SIGKILL)
    graded = results[0].get(timeout=90)
    report = results[1].get(timeout=90)
    assert graded["entry"] and not graded["duplicate"]
    assert report["verdict"] == "admitted", report
    for result in results:
        assert int(client.get(keys.attempts(result.id))) == 2, "delivered twice"
        assert not client.hexists(keys.DEAD_LETTERS, result.id)
    _check_side_effects_once(cluster, client, run, grade, validate)
    for worker in (first, second):
        assert worker.proc.poll() is None


@pytest.mark.parametrize("handed_back", [False, True], ids=["after-the-timeout", "at-once"])
def test_a_killed_worker_has_its_jobs_run_by_another(
    cluster: Cluster, first: Worker, second: Worker, client: Any, handed_back: bool
) -> None:
    """The doomed worker is the only consumer of its queues; with `handed_back`, its jobs are
    given back as soon as it is gone (`restore_unacknowledged`, what `evoenv up` does when one
    of its workers dies), and run well before their visibility timeout would have let them."""
    app = cluster.app
    survivors = [first.node, second.node]
    for queue in QUEUES:
        app.control.cancel_consumer(queue, destination=survivors, reply=True, timeout=5)
    workers = [first, second]
    try:
        doomed = cluster.start_worker(QUEUES, concurrency=2)
        workers.append(doomed)
        run = f"node-kill-{uuid.uuid4().hex[:6]}"
        grade, validate = _slow_jobs(run)
        results = [tasks.grade.delay(grade), tasks.validate.delay(validate)]
        ids = {r.id for r in results}
        # Kill as soon as both jobs run in their sandboxes, not after a fixed pause: a job that
        # ends before the kill is done by the doomed worker, whose name its result then rightly
        # bears, and is not delivered again.
        running = wait_for(
            lambda: _running(cluster, [doomed], ids), 60, "both jobs to start", every=0.1
        )
        wait_for(lambda: _in_their_sandboxes(client, running), 30, "both sandboxes", every=0.05)
        killed_at = time.monotonic()
        pids = doomed.kill()
        assert not wait_gone(pids), "the killed worker left processes behind"
        for result in results:
            # The kill interrupted the job: its last state is the doomed worker's STARTED.
            assert result.state == "STARTED", "the job ended before the kill"
            assert result.worker == doomed.node
        if handed_back:
            # `up`'s sweep takes only jobs older than the visibility timeout: not these
            assert restore_unacknowledged(cluster.redis_url, older_than=VISIBILITY) == 0
            assert restore_unacknowledged(cluster.redis_url, QUEUES) == 2
            assert sum(client.llen(queue) for queue in QUEUES) == 2  # back in their queues
        # Only now may a survivor take the jobs: at once if handed back, else once their
        # visibility timeout has run out.
        for queue in QUEUES:
            app.control.add_consumer(queue, destination=[second.node], reply=True, timeout=5)
        graded = results[0].get(timeout=VISIBILITY + 60)
        report = results[1].get(timeout=VISIBILITY + 60)
        waited = time.monotonic() - killed_at
        # A second copy of a redelivered job finds its group on the stream (`duplicate`).
        assert (graded["entry"] or graded["duplicate"]) and report["verdict"] == "admitted"
        for result in results:
            # The result is written by the worker that ran the job to its end: the survivor,
            # the only worker consuming these queues after the kill.
            assert result.worker == second.node
            assert int(client.get(keys.attempts(result.id))) in (2, 3), "delivered again"
            assert not client.hexists(keys.DEAD_LETTERS, result.id)
        _check_side_effects_once(cluster, client, run, grade, validate)
        assert waited < (VISIBILITY - 3 if handed_back else VISIBILITY + 30), waited
    except BaseException:
        _print_deliveries(workers)
        raise
    finally:
        for queue in QUEUES:
            app.control.add_consumer(queue, destination=survivors, reply=True, timeout=5)


def test_a_job_delivered_too_often_lands_in_the_dead_letters(
    cluster: Cluster, first: Worker, second: Worker, client: Any
) -> None:
    job = validate_job(SLOW, "dies_every_time.py")
    tasks.validate.apply_async(args=[job], task_id=job["job_id"])
    for delivery in range(1, MAX_DELIVERIES + 1):

        def started(delivery: int = delivery) -> dict[str, Any]:
            if int(client.get(keys.attempts(job["job_id"])) or 0) < delivery:
                return {}
            return _running(cluster, [first, second], {job["job_id"]})

        running = wait_for(started, 60, f"delivery {delivery} to start", every=0.2)
        time.sleep(0.5)
        os.kill(running[job["job_id"]][1], signal.SIGKILL)
    letter = wait_for(lambda: client.hget(keys.DEAD_LETTERS, job["job_id"]), 60, "the dead letter")
    assert json.loads(letter)["attempts"] == MAX_DELIVERIES + 1
    assert rows_for(cluster, job["job_id"]) == []
    env = cluster.worker_env()
    status = json.loads(run_cli("status", "--json", env=env).stdout)
    (dead,) = [d for d in status["dead_letters"] if d["task_id"] == job["job_id"]]
    assert dead["task"] == "evoenv.validate" and "redelivered" in dead["error"]
    shown = run_cli("job", job["job_id"], "--json", env=env)
    assert "Traceback" not in shown.stderr, shown.stderr
    assert shown.returncode == 3, (shown.stdout, shown.stderr)
    assert f"dead-lettered after {MAX_DELIVERIES + 1} deliveries" in shown.stderr, shown.stderr
