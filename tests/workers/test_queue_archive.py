"""The archive with several processes writing at once, as the workers of a cluster do: on SQLite
(one machine) and on PostgreSQL (many). Each process opens a fresh archive (so the schema is
created by all of them at once), then writes validation reports and environments whose keys
overlap with the other processes': no "database is locked", no duplicate rows, and each key
reported new by exactly one writer.

PostgreSQL: EVOENV_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
is an administrative connection used to create and drop a database of the test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import missing
from workerkit import REPO

pytestmark = pytest.mark.integration

PROCESSES = 4
WRITES = 50
JOB_IDS = 100
"""Distinct job ids among the PROCESSES x WRITES reports: every id is written twice."""
SOURCES = 30
"""Distinct environment sources among the PROCESSES x WRITES environments."""
ADMIN_URL = os.environ.get(
    "EVOENV_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

WRITER = """
import json, sys, time
from shared.db import Archive
from shared.messages import StageReport, ValidationReport

url, index, writes, job_ids, sources, start_at = sys.argv[1:]
index, writes, job_ids, sources = int(index), int(writes), int(job_ids), int(sources)
while time.time() < float(start_at):
    time.sleep(0.001)
archive = Archive(url)
new_reports, shas = [], []
for i in range(writes):
    key = (index * writes // 2 + i) % job_ids
    stages = [StageReport(stage=s, ok=True, seconds=0.01, detail=f"{s} ok")
              for s in ("L1", "L2", "L3")]
    report = ValidationReport(file=f"env{key}.py", name=f"env_{key}", verdict="admitted",
                              failed_stage=None, stages=stages)
    if archive.record_validation(f"job-{key}", f"sha-{key}", report, adhoc=True):
        new_reports.append(key)
    source = f"# environment {(index * 7 + i) % sources}\\n"
    shas.append(archive.add_environment(f"env_{(index * 7 + i) % sources}", source))
print(json.dumps({"new_reports": new_reports, "shas": sorted(set(shas))}))
"""


def _write_at_once(url: str) -> list[dict[str, list[str]]]:
    start_at = time.time() + 2.0  # every process has imported the archive by then
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                url,
                str(i),
                str(WRITES),
                str(JOB_IDS),
                str(SOURCES),
                str(start_at),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert "locked" not in err, err
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out) for out, _ in outputs]


def _check(url: str, results: list[dict[str, list[str]]]) -> None:
    from sqlalchemy import text

    from shared.db import Archive

    new = [key for result in results for key in result["new_reports"]]
    assert sorted(new) == list(range(JOB_IDS)), "each job id reported new exactly once"
    archive = Archive(url)
    try:
        with archive.engine.connect() as connection:

            def count(sql: str) -> int:
                return int(connection.execute(text(sql)).scalar_one())

            assert count("SELECT count(*) FROM validation_reports") == JOB_IDS
            assert count("SELECT count(DISTINCT job_id) FROM validation_reports") == JOB_IDS
            assert count("SELECT count(*) FROM validation_stages") == JOB_IDS * 3
            assert count("SELECT count(*) FROM environments") == SOURCES
            assert count("SELECT count(*) FROM schema_version") == 1
        shas = {sha for result in results for sha in result["shas"]}
        assert len(shas) == SOURCES
        assert {row.sha for row in archive.environments()} == shas
        report = archive.validation("job-7")
        assert report is not None and report.name == "env_7"
    finally:
        archive.engine.dispose()


def test_sqlite_archive_takes_concurrent_writers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    _check(url, _write_at_once(url))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"evoenv_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        missing(f"PostgreSQL is unreachable at {ADMIN_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            base = ADMIN_URL.rsplit("/", 1)[0]
            yield f"{base}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_postgres_archive_takes_concurrent_writers(postgres_url: str) -> None:
    # The URL as a user writes it (`postgresql://`): the archive picks the installed driver.
    _check(postgres_url, _write_at_once(postgres_url))
