"""Redis restarted (append-only file on) while jobs wait in the queues and no worker runs:
once it is back, a worker started then runs every one of them.

The Redis here is a private one of the same kind as the session's (`restart()` keeps its data),
so the session's clients are not left holding dead connections. This process talks to it with
a bare Celery client that has no result backend (a backend would stay subscribed to the old
connection); results are read from Redis directly.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from model.fake_vllm import FakeServer, free_port
from workerkit import REPO, Cluster, solver_job, stream_groups, validate_job, wait_for

from shared import keys

pytestmark = pytest.mark.integration

DOUBLING = (REPO / "tests" / "workers" / "doubling_env.py").read_text()


@pytest.fixture
def server(redis_server: Any, tmp_path: Path) -> Iterator[Any]:
    """A private redis-server like the session's, with append-only persistence."""
    private = type(redis_server)(tmp_path / "redis")
    private.folder.mkdir()
    private.start()
    yield private
    private.stop()


def _client_app(url: str) -> Celery:
    return Celery(
        "restart-test",
        broker=url,
        set_as_current=False,
        config_source={"task_serializer": "json", "accept_content": ["json"]},
    )


def _depths(client: Any) -> dict[str, int]:
    return {queue: int(client.llen(queue)) for queue in keys.QUEUES}


def _meta(client: Any, task_id: str) -> dict[str, Any] | None:
    raw = client.get(f"celery-task-meta-{task_id}")
    return None if raw is None else json.loads(raw)


def test_queued_jobs_survive_a_redis_restart(server: Any, tmp_path: Path) -> None:
    run = f"restart-{uuid.uuid4().hex[:6]}"
    grades = [solver_job(DOUBLING, ["2", str(seed)], run=run, seed=seed) for seed in range(6)]
    checks = [validate_job(DOUBLING, f"doubling-{i}.py") for i in range(3)]
    sender = _client_app(server.url)
    ids = [
        sender.send_task("evoenv.grade", args=[job], queue=keys.GRADING_QUEUE).id for job in grades
    ]
    for job in checks:
        sender.send_task(
            "evoenv.validate", args=[job], queue=keys.VALIDATION_QUEUE, task_id=job["job_id"]
        )
        ids.append(job["job_id"])
    sender.close()
    client = redis.Redis.from_url(server.url)
    before = _depths(client)
    assert before == {keys.GENERATION_QUEUE: 0, keys.GRADING_QUEUE: 6, keys.VALIDATION_QUEUE: 3}
    client.close()

    server.restart()
    client = redis.Redis.from_url(server.url)
    try:
        assert _depths(client) == before, "the queues came back from the append-only file"
        cluster = Cluster(server.url, tmp_path, _client_app(server.url), {})
        try:
            cluster.start_worker([keys.GRADING_QUEUE, keys.VALIDATION_QUEUE], concurrency=2)

            def done() -> bool:
                return all((_meta(client, i) or {}).get("status") == "SUCCESS" for i in ids)

            wait_for(done, 120, "every queued job to run", 0.5)
        finally:
            cluster.stop()
            cluster.app.close()
        groups = stream_groups(server.url, run)
        assert sorted(g["group_id"] for g in groups) == sorted(j["group_id"] for j in grades)
        for job in checks:
            meta = _meta(client, job["job_id"])
            assert meta is not None and meta["result"]["verdict"] == "admitted"
        assert _depths(client) == dict.fromkeys(keys.QUEUES, 0)
    finally:
        client.close()


SLOW_SCORE = DOUBLING.replace(
    "    def score(self, instance: dict, reference: int, answer: str) -> float:\n",
    "    def score(self, instance: dict, reference: int, answer: str) -> float:\n"
    "        import time\n\n"
    "        time.sleep(1.5)\n",
)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_worker_with_a_job_in_flight_lives_through_a_redis_restart(
    server: Any, tmp_path: Path, pool: str
) -> None:
    """Redis goes away for a few seconds while a job runs: the worker reconnects instead of
    stopping, the job's acknowledgement reaches the restarted Redis (nothing left to be
    delivered again), and the worker takes the next job."""
    assert SLOW_SCORE != DOUBLING
    run = f"inflight-{uuid.uuid4().hex[:6]}"
    slow = solver_job(SLOW_SCORE, [str(2 * n) for n in range(16)], run=run)
    cluster = Cluster(server.url, tmp_path, _client_app(server.url), {})
    client = redis.Redis.from_url(server.url)
    try:
        worker = cluster.start_worker([keys.GRADING_QUEUE], concurrency=2, pool=pool)
        slow_id = cluster.app.send_task("evoenv.grade", args=[slow], queue=keys.GRADING_QUEUE).id
        wait_for(lambda: cluster.active(worker), 60, "the slow job to start", 0.5)
        server.restart(down=5.0)
        client = redis.Redis.from_url(server.url)
        wait_for(
            lambda: (_meta(client, slow_id) or {}).get("status") == "SUCCESS",
            120,
            "the slow job to finish",
            0.5,
        )
        fast = solver_job(DOUBLING, ["2"], run=run, seed=1)
        fast_id = cluster.app.send_task("evoenv.grade", args=[fast], queue=keys.GRADING_QUEUE).id
        wait_for(
            lambda: (
                (_meta(client, fast_id) or {}).get("status") == "SUCCESS"
                or worker.proc.poll() is not None
            ),
            60,
            "the next job to run (or the worker to stop)",
            0.5,
        )
        assert worker.proc.poll() is None, f"the worker stopped:\n{worker.log_text()[-3000:]}"
        assert "Unrecoverable error" not in worker.log_text()
        assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0, (
            "a finished job is still waiting to be delivered again"
        )
        groups = [g["group_id"] for g in stream_groups(server.url, run)]
        assert sorted(groups) == sorted([slow["group_id"], fast["group_id"]])
    finally:
        cluster.stop()
        cluster.app.close()
        client.close()


def test_a_job_waiting_for_its_retry_runs_once_after_redis_is_killed(
    server: Any, tmp_path: Path
) -> None:
    """The model server is down: a completion job fails for an infrastructure reason and waits
    for its retry (Celery's countdown). Redis is SIGKILLed meanwhile and started again on its
    append-only file; once the model server answers, the job runs to its result, once: nothing
    lost, nothing left queued or unacknowledged."""
    vllm = f"http://127.0.0.1:{free_port()}"
    job = solver_job(DOUBLING, ["2", "4"], run=f"retry-{uuid.uuid4().hex[:6]}")
    job["completions"] = []
    limits = {
        "EVOENV_WORKER__SERVER_OUTAGE_WAIT": "0",  # a retry with backoff, not a wait in the job
        "EVOENV_WORKER__MAX_RETRIES": "40",
        "EVOENV_WORKER__MAX_DELIVERIES": "50",
        "EVOENV_WORKER__COMPLETE_TIME_LIMIT": "20",
        "EVOENV_WORKER__VALIDATE_TIME_LIMIT": "20",
        "EVOENV_WORKER__GRADE_TIME_LIMIT": "20",
        "EVOENV_WORKER__VISIBILITY_TIMEOUT": "30",
    }
    cluster = Cluster(server.url, tmp_path, _client_app(server.url), {"EVOENV_VLLM_URLS": vllm})
    model: FakeServer | None = None
    client = redis.Redis.from_url(server.url)
    try:
        worker = cluster.start_worker([keys.GENERATION_QUEUE], concurrency=2, **limits)
        task_id = cluster.app.send_task(
            "evoenv.complete", args=[job], queue=keys.GENERATION_QUEUE
        ).id
        wait_for(lambda: "job_retry" in worker.log_text(), 60, "the job to fail and wait", 0.5)
        server.restart(down=2.0, kill=True)
        client = redis.Redis.from_url(server.url)
        wait_for(
            lambda: worker.log_text().count("job_retry") >= 2, 90, "a retry after the kill", 0.5
        )
        model = FakeServer(port=int(vllm.rsplit(":", 1)[1]))
        model.routes[("POST", "/v1/chat/completions/render")] = (404, {"detail": "Not Found"})
        choice = {
            "message": {"content": "<answer>4</answer>"},
            "token_ids": [7, 8],
            "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
            "finish_reason": "stop",
        }
        model.routes[("POST", "/v1/chat/completions")] = (
            200,
            {"choices": [{**choice, "index": i} for i in range(2)], "prompt_token_ids": [1, 2]},
        )
        wait_for(
            lambda: (_meta(client, task_id) or {}).get("status") == "SUCCESS",
            120,
            "the job to complete once the model server answers",
            0.5,
        )
        meta = _meta(client, task_id)
        assert meta is not None and len(meta["result"]["completions"]) == 2
        time.sleep(3)  # a second run of the same job would reach the model server again
        assert model.paths().count("/v1/chat/completions") == 1
        assert worker.proc.poll() is None, worker.log_text()[-3000:]
        assert client.hlen("unacked") == 0 and _depths(client) == dict.fromkeys(keys.QUEUES, 0)
    finally:
        cluster.stop()
        cluster.app.close()
        client.close()
        if model is not None:
            model.close()
