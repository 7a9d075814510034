"""`evoenv status` run beside a running `evoenv up` of the same data folder reads that `up`'s
private Redis (found through the record in the run folder), not the default one, and says so
on stderr, its `--json` output staying one parseable object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evoenv_cli.up_record import write_record
from shared import keys
from shared.config import Settings

pytestmark = pytest.mark.integration


def test_status_reads_the_redis_of_the_running_up(redis_url: str, tmp_path: Path) -> None:
    import redis

    settings = Settings(data_dir=tmp_path, redis_url=redis_url)
    settings.run_dir.mkdir(parents=True)
    write_record(settings.run_dir, redis_url)  # this process stands for the running `up`
    client = redis.Redis.from_url(redis_url)
    client.set(keys.POLICY_VERSION, 7)
    client.rpush(keys.VALIDATION_QUEUE, b"queued")
    client.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    done = subprocess.run(
        [sys.executable, "-c", "from evoenv_cli import main; main()", "status", "--json"],
        env={**env, "EVOENV_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["redis"] == redis_url
    assert report["policy_version"] == 7 and report["queues"][keys.VALIDATION_QUEUE] == 1
    assert (
        f"redis: {redis_url} (the running `evoenv up` of {settings.run_dir}, pid {os.getpid()})"
        in done.stderr
    )
