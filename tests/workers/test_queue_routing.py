"""Routing, ad-hoc validation through the queue and bad messages, on two real workers: one
consuming only `grading`, one only `validation`."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import pytest
import redis
from workerkit import (
    CLI,
    REPO,
    Cluster,
    Worker,
    archive_rows,
    run_cli,
    solver_job,
    stream_groups,
    validate_job,
    wait_for,
)

from evoenv_worker import tasks
from shared import keys
from shared.messages import DeadLetter

pytestmark = pytest.mark.integration

OP_SECONDS = "2"
"""The per-call sandbox limit of the corpus test (tests/test_validate_corpus.py), on both sides."""
DOUBLING = (REPO / "tests" / "workers" / "doubling_env.py").read_text()
SEEDS = sorted((REPO / "seeds").glob("*.py"))
CORPUS = sorted((REPO / "tests" / "corpus" / "flawed").glob("*.py")) + sorted(
    (REPO / "tests" / "corpus" / "sound").glob("*.py")
)


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any) -> Cluster:
    return cluster_factory(EVOENV_SANDBOX__OP_SECONDS=OP_SECONDS)


@pytest.fixture(scope="module")
def grading(cluster: Cluster) -> Worker:
    return cluster.start_worker([keys.GRADING_QUEUE], concurrency=1)


@pytest.fixture(scope="module")
def validation(cluster: Cluster) -> Worker:
    return cluster.start_worker([keys.VALIDATION_QUEUE], concurrency=2)


@pytest.fixture
def client(cluster: Cluster) -> Any:
    connection = redis.Redis.from_url(cluster.redis_url)
    yield connection
    connection.close()


def test_each_job_runs_only_on_the_worker_of_its_queue(
    cluster: Cluster, grading: Worker, validation: Worker, client: Any
) -> None:
    run = f"routing-{uuid.uuid4().hex[:6]}"
    sent = []
    for seed in range(3):
        sent.append(
            (tasks.grade.delay(solver_job(DOUBLING, ["2", "x"], run=run, seed=seed)), grading)
        )
        sample = solver_job(DOUBLING, [], run=run, seed=seed)
        sent.append((tasks.sample.delay(sample), grading))
        sent.append(
            (tasks.validate.delay(validate_job(DOUBLING, f"doubling-{seed}.py")), validation)
        )
    # Nobody consumes `generation`: a job sent there waits, and no worker takes it.
    stray = tasks.grade.apply_async(
        args=[solver_job(DOUBLING, ["1"], run=run)], queue=keys.GENERATION_QUEUE
    )
    for result, worker in sent:
        result.get(timeout=60)
        assert (result.name, result.worker, result.queue) == (
            result.name,
            worker.node,
            worker.queues[0],
        ), result.name
    assert {r.name for r, _ in sent} == {"evoenv.grade", "evoenv.sample", "evoenv.validate"}
    assert stray.state == "PENDING"
    assert client.llen(keys.GENERATION_QUEUE) == 1
    assert len(stream_groups(cluster.redis_url, run)) == 3
    client.delete(keys.GENERATION_QUEUE)


def test_the_same_grade_job_twice_appends_one_group(cluster: Cluster, grading: Worker) -> None:
    run = f"dup-{uuid.uuid4().hex[:6]}"
    payload = solver_job(DOUBLING, ["0", "no", "12"], run=run, seed=5)
    first = tasks.grade.delay(payload).get(timeout=60)
    second = tasks.grade.delay(payload).get(timeout=60)
    assert first["entry"] and not first["duplicate"]
    assert second["entry"] is None and second["duplicate"]
    (group,) = stream_groups(cluster.redis_url, run)
    assert group["group_id"] == payload["group_id"] == first["group_id"]
    assert group["policy_version"] == 3, "the group counts as its oldest completion"
    assert [c["outcome"] for c in group["completions"]] == ["scored", "scored", "scored"]
    assert [c["token_ids"] for c in group["completions"]] == [[1, 2]] * 3
    assert first["rewards"] == second["rewards"] == [c["reward"] for c in group["completions"]]


def _reports(lines: str) -> dict[str, dict[str, Any]]:
    reports = [json.loads(line) for line in lines.splitlines() if line.strip()]
    return {report["file"]: report for report in reports}


def _verdict(report: dict[str, Any]) -> tuple[Any, ...]:
    return (
        report["name"],
        report["verdict"],
        report["failed_stage"],
        [(s["stage"], s["ok"]) for s in report["stages"]],
    )


def test_queue_validation_gives_the_local_verdicts(cluster: Cluster, validation: Worker) -> None:
    files = [str(p.relative_to(REPO)) for p in [*SEEDS, *CORPUS]]
    assert len(SEEDS) >= 10
    env = cluster.worker_env()
    started = time.monotonic()

    def cli(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*CLI, "validate", "--json", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # Local mode in two processes (its wall time is mostly sandbox start-ups and time limits).
    local = [cli(*files[0::2]), cli(*files[1::2])]
    queued = cli("--queue", *files)
    queued_out, queued_err = queued.communicate(timeout=300)
    outputs = [p.communicate(timeout=300) for p in local]
    local_out, local_err = "".join(o for o, _ in outputs), "".join(e for _, e in outputs)
    local_code = max(p.returncode for p in local)
    assert local_code == queued.returncode, (local_err, queued_err)
    assert local_code in {0, 1}, local_err
    by_local, by_queue = _reports(local_out), _reports(queued_out)
    assert sorted(by_local) == sorted(by_queue) == sorted(files)
    for file in files:
        assert _verdict(by_queue[file]) == _verdict(by_local[file]), file
        assert by_queue[file].keys() == by_local[file].keys(), file
    for seed in SEEDS:
        assert by_queue[str(seed.relative_to(REPO))]["verdict"] == "admitted", seed
    # Each job is archived once, under its id (ad-hoc: nothing goes into the pool).
    rows = archive_rows(cluster.data_dir, "validation_reports")
    files_archived = [row[2] for row in rows]
    for file in files:
        assert files_archived.count(file) == 1, file
    assert archive_rows(cluster.data_dir, "environments") == []
    print(
        f"{len(files)} files, local and queued side by side in {time.monotonic() - started:.1f} s"
    )


def _dead_letter(client: Any, task_id: str) -> DeadLetter | None:
    raw = client.hget(keys.DEAD_LETTERS, task_id)
    return None if raw is None else DeadLetter.model_validate_json(raw)


def test_a_malformed_payload_is_dead_lettered_and_the_worker_lives_on(
    cluster: Cluster, validation: Worker, grading: Worker, client: Any
) -> None:
    bad_validate = tasks.validate.delay({"job_id": 7, "source": None})
    bad_grade = tasks.grade.delay({"schema_version": 1, "run": "x"})
    letters = wait_for(
        lambda: (
            [_dead_letter(client, r.id) for r in (bad_validate, bad_grade)]
            if all(client.hexists(keys.DEAD_LETTERS, r.id) for r in (bad_validate, bad_grade))
            else None
        ),
        30,
        "the dead letters of the malformed jobs",
    )
    for letter, task in zip(letters, ("evoenv.validate", "evoenv.grade"), strict=True):
        assert letter.task == task
        assert "malformed" in letter.error, letter.error
    assert "ValidateJob" in letters[0].error and "SolverJob" in letters[1].error
    assert letters[0].payload == {"job_id": 7, "source": None}
    for worker, result in ((validation, bad_validate), (grading, bad_grade)):
        reasons = [e for e in worker.log_events() if e.get("event") == "bad_message"]
        assert any(e.get("task_id") == result.id and "malformed" in e["reason"] for e in reasons)
        assert worker.proc.poll() is None
    # The workers go on: normal jobs afterwards succeed.
    report = tasks.validate.delay(validate_job(DOUBLING)).get(timeout=60)
    assert report["verdict"] == "admitted"
    graded = tasks.grade.delay(solver_job(DOUBLING, ["4"], run="after-bad")).get(timeout=60)
    assert graded["entry"]


def test_garbage_in_a_queue_does_not_kill_the_worker(
    cluster: Cluster, validation: Worker, client: Any
) -> None:
    garbage = [b"\x00not json at all", b'{"json": "but not a message"}', b"[1, 2]", b'"text"']
    for entry in garbage:
        client.lpush(keys.VALIDATION_QUEUE, entry)
    wait_for(lambda: client.llen(keys.VALIDATION_QUEUE) == 0, 30, "the garbage to be consumed")
    report = tasks.validate.delay(validate_job(DOUBLING)).get(timeout=60)
    assert report["verdict"] == "admitted"
    assert validation.proc.poll() is None
    dropped = [
        e
        for e in validation.log_events()
        if e.get("event") == "bad_message" and "not a message" in e.get("reason", "")
    ]
    assert len(dropped) == len(garbage), validation.log_text()[-3000:]


def test_status_shows_queues_and_workers(
    cluster: Cluster, grading: Worker, validation: Worker
) -> None:
    result = run_cli("status", "--json", env=cluster.worker_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["workers"] == {grading.node: ["grading"], validation.node: ["validation"]}
    assert set(report["queues"]) == set(keys.QUEUES)
