"""A real grading worker signs the group it appends with the key of its data folder, which the
learner's check on the same machine verifies, and names that key at its start."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from workerkit import REPO, Cluster, solver_job

from evoenv_worker import tasks
from shared import keys
from shared.config import Settings
from shared.rollouts import EntryCheck, decode_entry
from shared.stream_key import KEY_FILE, key_id

pytestmark = pytest.mark.integration
DOUBLING = (REPO / "tests" / "workers" / "doubling_env.py").read_text()


@pytest.fixture(scope="module")
def cluster(cluster_factory: Any) -> Cluster:
    return cluster_factory()


def test_a_workers_group_verifies_with_the_key_of_its_data_folder(cluster: Cluster) -> None:
    worker = cluster.start_worker([keys.GRADING_QUEUE], concurrency=1)
    run = f"signed-{uuid.uuid4().hex[:6]}"
    tasks.grade.delay(solver_job(DOUBLING, ["2", "x"], run=run)).get(timeout=60)
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        ((_, fields),) = client.xrange(keys.rollout_stream(run))
    finally:
        client.close()
    check = EntryCheck.of(Settings(data_dir=cluster.data_dir))  # the learner beside it
    assert check.forged(keys.rollout_stream(run), fields) is None
    assert check.out_of_range(decode_entry(fields)) is None
    assert f"stream key {key_id(check.key)} ({cluster.data_dir / KEY_FILE})" in worker.log_text()
    elsewhere = EntryCheck.of(Settings(stream_key="e" * 32))  # a learner with another key
    assert "signed with another key" in str(elsewhere.forged(keys.rollout_stream(run), fields))
