"""Fixtures of the queue tests: the project's Celery app as a client of the private Redis, and
clusters of real worker subprocesses, one per module (see `workerkit`).

The session's Redis is flushed when a module makes its cluster, before its first worker starts:
flushing under a running worker would delete its queue bindings. Tests that share a module's
workers keep apart by fresh job ids, group ids and run names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from workerkit import Cluster, flush, require_sandbox


@pytest.fixture(scope="session")
def celery_app(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The project's Celery app, configured in this process as a client of the private Redis."""
    from evoenv_worker.app import configure
    from shared.config import Settings

    settings = Settings(redis_url=redis_server.url, data_dir=tmp_path_factory.mktemp("client"))
    return configure(settings)


@pytest.fixture(scope="module")
def cluster_factory(
    redis_server: Any, celery_app: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Cluster]]:
    """Make a cluster on a flushed Redis, its workers' extra settings given as `EVOENV_*`
    keyword arguments; every worker of it is killed (and checked gone) after the module."""
    clusters: list[Cluster] = []

    def make(**env: str) -> Cluster:
        require_sandbox()
        flush(redis_server.url)
        cluster = Cluster(redis_server.url, tmp_path_factory.mktemp("data"), celery_app, env)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
