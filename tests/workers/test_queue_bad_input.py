"""The CLI's queue commands facing a Redis that is not there, or a queue nobody consumes: a
clear one-line error within seconds, never a hang. (Malformed messages reaching a worker are
in test_queue_routing.py, which has the workers.)"""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from workerkit import REPO, clean_env, run_cli

from shared import keys

pytestmark = pytest.mark.integration

EXIT_ERROR = 3
ENV_FILE = REPO / "tests" / "workers" / "doubling_env.py"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when this returns


def _one_line(stderr: str) -> str:
    """The one line of the error or warning, beside the line that says which Redis was read
    (these tests set EVOENV_REDIS_URL; `worker` prints none)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("redis: ")]
    rest = [line for line in lines if not line.startswith("redis: ")]
    assert len(rest) == 1 and len(said) <= 1, stderr
    assert all(line.endswith("(set by EVOENV_REDIS_URL)") for line in said), stderr
    assert "Traceback" not in stderr
    return rest[0]


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--json"),
        ("validate", "--queue", str(ENV_FILE)),
        ("validate", "--queue", "--no-wait", str(ENV_FILE)),
        ("job", "0b7d3a52-0000-0000-0000-000000000000"),
        ("worker", "-Q", "validation"),
    ],
    ids=lambda args: " ".join(a for a in args if not a.startswith("/"))[:40],
)
def test_an_unreachable_redis_is_a_one_line_error_within_seconds(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    env = clean_env(EVOENV_REDIS_URL=url, EVOENV_DATA_DIR=str(tmp_path))
    started = time.monotonic()
    result = run_cli(*args, env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_ERROR, (result.stdout, result.stderr)
    line = _one_line(result.stderr)
    assert line.startswith("error: cannot reach Redis at") and url in line, line
    assert elapsed < 10, f"took {elapsed:.1f} s"


@pytest.fixture
def lonely_url(redis_url: str) -> str:
    """The private Redis, in a database no worker listens on (control messages are per db)."""
    return redis_url.rsplit("/", 1)[0] + "/9"


def test_queue_with_no_worker_says_so_and_exits_3(lonely_url: str, tmp_path: Path) -> None:
    env = clean_env(EVOENV_REDIS_URL=lonely_url, EVOENV_DATA_DIR=str(tmp_path))
    started = time.monotonic()
    result = run_cli("validate", "--queue", "--json", ENV_FILE, env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_ERROR, (result.stdout, result.stderr)
    line = _one_line(result.stderr)
    assert "no worker is consuming the 'validation' queue" in line, line
    assert result.stdout == ""
    assert elapsed < 15, f"took {elapsed:.1f} s"
    client = redis.Redis.from_url(lonely_url)
    try:
        assert client.llen(keys.VALIDATION_QUEUE) == 0, "nothing was left waiting"
    finally:
        client.close()


def test_no_wait_with_no_worker_queues_the_job_and_job_shows_it(
    lonely_url: str, tmp_path: Path
) -> None:
    env = clean_env(EVOENV_REDIS_URL=lonely_url, EVOENV_DATA_DIR=str(tmp_path))
    result = run_cli("validate", "--queue", "--no-wait", ENV_FILE, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "no worker is consuming" in _one_line(result.stderr)
    job_id, file = result.stdout.split()
    assert file == str(ENV_FILE)
    client: Any = redis.Redis.from_url(lonely_url)
    try:
        assert client.llen(keys.VALIDATION_QUEUE) == 1
    finally:
        client.close()
    shown = run_cli("job", job_id, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"job {job_id}: queued (or unknown id)"


def test_a_huge_file_sends_at_most_the_size_limit_plus_one_byte_to_the_queue(
    lonely_url: str, tmp_path: Path
) -> None:
    from shared.config import Settings
    from shared.messages import ValidateJob

    limit = Settings().validation.max_source_bytes
    big = tmp_path / "big.py"
    with big.open("wb") as f:
        f.truncate(2 * 1024**3)  # sparse: 2 GiB of NUL bytes on no disk
    client: Any = redis.Redis.from_url(lonely_url)
    client.delete(keys.VALIDATION_QUEUE)
    env = clean_env(EVOENV_REDIS_URL=lonely_url, EVOENV_DATA_DIR=str(tmp_path))
    try:
        result = run_cli("validate", "--queue", "--no-wait", big, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        messages = client.lrange(keys.VALIDATION_QUEUE, 0, -1)
        assert len(messages) == 1
        raw = messages[0]
        assert len(raw) < 10 * limit, f"the message is {len(raw)} bytes"
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        args, _kwargs, _embed = body
        job = ValidateJob.model_validate(args[0])
        assert job.file == str(big)
        assert job.data == b"\0" * (limit + 1)
    finally:
        client.delete(keys.VALIDATION_QUEUE)
        client.close()
