"""The one-machine story of the deploy scripts: Redis, a worker and Flower started with
deploy/redis.sh, deploy/worker.sh and deploy/flower.sh, all reading one settings file
(EVOENV_ENV_FILE); `evoenv validate --queue` jobs submitted and watched through Flower's API,
which refuses requests without the basic-auth password. The Redis has a password, which every
client takes from the URL and no log shows."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from support import free_port, missing
from workerkit import (
    Service,
    clean_env,
    require_sandbox,
    run_cli,
    slow_env,
    spawn,
    wait_for,
    wait_gone,
)

from shared import keys

pytestmark = pytest.mark.integration

USER, PASSWORD = "evoenv", "s3cret-for-tests"
REDIS_PASSWORD = "redis/p@ss:w0rd-for-tests"
"""With characters a URL must quote: every client must unquote it, none strip it."""
JOBS = 2


@dataclass
class Deployment:
    env: dict[str, str]
    """The deploy scripts' environment: only EVOENV_ENV_FILE, the settings are in the file."""
    cli_env: dict[str, str]
    """The same settings as variables, for `evoenv` run directly (it reads no file)."""
    redis_url: str
    flower_url: str
    data_dir: Path
    services: dict[str, Service]

    def api(self, path: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> httpx.Response:
        return httpx.get(f"{self.flower_url}{path}", auth=auth, timeout=20)


def _workers(deployment: Deployment) -> dict[str, Any]:
    try:
        response = deployment.api("/api/workers?refresh=1")
    except httpx.TransportError:
        return {}
    return response.json() if response.status_code == 200 else {}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    require_sandbox()
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (scripts/setup.sh installs it)")
    folder = tmp_path_factory.mktemp("deploy")
    redis_port, flower_port = free_port(), free_port()
    settings = {
        "EVOENV_REDIS_URL": f"redis://:{quote(REDIS_PASSWORD, safe='')}@127.0.0.1:{redis_port}/0",
        "EVOENV_REDIS_PORT": str(redis_port),
        "EVOENV_REDIS_PASSWORD": REDIS_PASSWORD,
        "EVOENV_DATA_DIR": str(folder / "data"),
        "EVOENV_FLOWER__PORT": str(flower_port),
        "EVOENV_FLOWER__BASIC_AUTH": f"{USER}:{PASSWORD}",
        "EVOENV_LOG_FORMAT": "json",
    }
    env_file = folder / "evoenv.env"
    env_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    env = clean_env(EVOENV_ENV_FILE=str(env_file))
    services: dict[str, Service] = {}
    deployment = Deployment(
        env,
        clean_env(**settings),
        settings["EVOENV_REDIS_URL"],
        f"http://127.0.0.1:{flower_port}",
        folder / "data",
        services,
    )
    try:
        services["redis"] = spawn(["bash", "deploy/redis.sh"], env, folder / "redis.log")
        client = redis.Redis.from_url(deployment.redis_url)
        wait_for(lambda: _pings(client), 20, "deploy/redis.sh to answer")
        client.close()
        services["worker"] = spawn(
            ["bash", "deploy/worker.sh", "--queues", "grading,validation", "--concurrency", "1"],
            env,
            folder / "worker.log",
        )
        services["flower"] = spawn(["bash", "deploy/flower.sh"], env, folder / "flower.log")
        wait_for(lambda: _workers(deployment), 90, "Flower to list the worker", every=0.5)
        yield deployment
    finally:
        killed = [pid for service in services.values() for pid in service.kill()]
        assert not wait_gone(killed), "processes left behind"


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_the_deploy_redis_is_append_only(deployment: Deployment) -> None:
    client = redis.Redis.from_url(deployment.redis_url, decode_responses=True)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("dir")["dir"] == str(deployment.data_dir / "redis")
    finally:
        client.close()


def test_flower_lists_the_worker_queue_lengths_and_the_jobs(
    deployment: Deployment, tmp_path: Path
) -> None:
    ((node, info),) = _workers(deployment).items()
    assert sorted(q["name"] for q in info["active_queues"]) == ["grading", "validation"]
    assert "evoenv.validate" in info["registered"]

    files = []
    for i in range(JOBS):
        path = tmp_path / f"slow_{i}.py"
        path.write_text(slow_env(solve_rounds=60_000, score_rounds=1))
        files.append(path)
    submitted = run_cli("validate", "--queue", "--no-wait", *files, env=deployment.cli_env)
    assert submitted.returncode == 0, submitted.stderr
    job_ids = [line.split()[0] for line in submitted.stdout.splitlines()]
    assert len(job_ids) == JOBS

    # One job runs (concurrency 1, prefetch 1); Flower sees the other waiting in the queue.
    client = redis.Redis.from_url(deployment.redis_url)
    try:
        wait_for(lambda: client.llen(keys.VALIDATION_QUEUE) < JOBS, 30, "a job to start")
        before = int(client.llen(keys.VALIDATION_QUEUE))
        response = deployment.api("/api/queues/length")
        after = int(client.llen(keys.VALIDATION_QUEUE))
    finally:
        client.close()
    assert response.status_code == 200, response.text
    lengths = {q["name"]: q["messages"] for q in response.json()["active_queues"]}
    assert set(lengths) == {"grading", "validation"}
    assert lengths["grading"] == 0
    assert after <= lengths["validation"] <= before
    assert before > 0, "the jobs finished before Flower was asked: make them slower"

    def seen_done() -> bool:
        tasks = deployment.api("/api/tasks?limit=100").json()
        return all(tasks.get(i, {}).get("state") == "SUCCESS" for i in job_ids)

    wait_for(seen_done, 120, "Flower to see every job succeed", every=0.5)
    task = deployment.api(f"/api/task/info/{job_ids[0]}").json()
    assert task["name"] == "evoenv.validate" and task["worker"] == node
    shown = run_cli("job", job_ids[0], "--json", env=deployment.cli_env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["verdict"] == "admitted"


@pytest.mark.parametrize("auth", [None, (USER, "wrong"), ("someone", PASSWORD)])
def test_flower_refuses_requests_without_the_password(
    deployment: Deployment, auth: tuple[str, str] | None
) -> None:
    for path in ("/api/workers", "/api/queues/length", "/api/tasks", "/"):
        response = deployment.api(path, auth=auth)
        assert response.status_code == 401, (path, response.status_code)


def test_the_deploy_redis_needs_its_password_and_no_log_shows_it(deployment: Deployment) -> None:
    port = deployment.redis_url.rsplit(":", 1)[1].split("/")[0]
    bare = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    with pytest.raises(redis.AuthenticationError):
        bare.ping()
    bare.close()
    status = run_cli("status", env=deployment.cli_env)
    assert status.returncode == 0, status.stderr
    assert ":***@" in status.stdout + status.stderr
    shown = [status.stdout, status.stderr]
    shown += [service.log.read_text(errors="replace") for service in deployment.services.values()]
    for secret in (REDIS_PASSWORD, quote(REDIS_PASSWORD, safe="")):
        assert not any(secret in text for text in shown)
