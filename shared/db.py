"""The archive: environments, validation reports, policy versions, checkpoints and metrics, in
SQLite or PostgreSQL (SQLModel). Rows written by jobs are keyed so that a redelivered job
writes nothing twice; the schema versions it reads are listed at `SCHEMA_VERSION`."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import JSON, Column, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, Session, SQLModel, col, create_engine, select

from shared.env_stats import EnvStats
from shared.errors import SchemaMismatch, UsageError
from shared.messages import ValidationReport

SCHEMA_VERSION = 2
"""The archive's version; it reads every one up to this. The schema is created on first use,
and each version that opened the archive is recorded in it:

    1  an environment's `stats` is a free JSON dict
    2  it is `EnvStats` (`shared/env_stats.py`), validated on every write and read

An archive of version 1 is read as it is, with no migration: version 2 stores the same JSON
(everything version 1 wrote fits the model, and version 1 reads what version 2 writes), and
records its own version beside the first. An archive a newer version has opened is refused
when it is opened, with one line (`SchemaMismatch`) that says which version it needs and what
to do, rather than row by row later: stats with a field this version does not know do not
validate. A row whose stats do not validate is refused with one line where it is read.

SQLite runs with WAL, a busy timeout and `BEGIN IMMEDIATE` transactions, so several worker
processes can write at once without "database is locked"; PostgreSQL (by URL) when workers
span machines. Environments are keyed by the sha256 of their source, validation reports by
job id."""
SCHEMA_LOCK = 0x65766F656E76
"""PostgreSQL advisory lock held while the schema is created."""

ENV_STATUSES = ("seed", "candidate", "admitted", "rejected", "retired", "quarantined")
SHORT_SHA_MIN = 6
"""The fewest hex digits of a sha that `Archive.find` takes as its start."""
FULL_SHA = re.compile(r"[0-9a-f]{64}")
SHORT_SHA = re.compile(f"[0-9a-f]{{{SHORT_SHA_MIN},63}}")


def utcnow() -> datetime:
    return datetime.now(UTC)


def source_sha(source: str | bytes) -> str:
    """The identity of an environment: sha256 of its source bytes."""
    data = source.encode("utf-8") if isinstance(source, str) else source
    return hashlib.sha256(data).hexdigest()


class StatsColumn(TypeDecorator[EnvStats]):
    """An environment's `stats`: `EnvStats` in Python, its `to_json()` in the database."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, EnvStats):
            raise TypeError(f"stats are written as EnvStats, got {type(value).__name__}")
        return value.to_json()

    def process_result_value(self, value: Any, dialect: Dialect) -> EnvStats:
        try:
            return EnvStats.from_json(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise SchemaMismatch(
                f"an environment's stats in the archive do not fit archive schema version "
                f"{SCHEMA_VERSION} ({where}: {error['msg']}): open the archive with the EvoEnv "
                "version that wrote them"
            ) from exc


class EnvironmentRow(SQLModel, table=True):
    __tablename__ = "environments"

    sha: str = Field(primary_key=True)
    name: str = Field(index=True)
    source: str
    status: str = Field(default="candidate", index=True)
    origin: str = "user"
    """seed, generated or user."""
    parents: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    stats: EnvStats = Field(default_factory=EnvStats, sa_column=Column(StatsColumn()))
    """Admission's figures, serving difficulty, use and error counts (`EnvStats`)."""
    embedding: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    """Novelty embeddings of the prompt and the code (the workers' novelty stage)."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class ValidationRow(SQLModel, table=True):
    __tablename__ = "validation_reports"

    job_id: str = Field(primary_key=True)
    env_sha: str = Field(index=True)
    file: str
    name: str | None = None
    verdict: str
    failed_stage: str | None = None
    adhoc: bool = True
    report: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)


class ValidationStageRow(SQLModel, table=True):
    __tablename__ = "validation_stages"

    job_id: str = Field(primary_key=True)
    stage: str = Field(primary_key=True)
    ok: bool
    seconds: float
    detail: str


class MetricRow(SQLModel, table=True):
    __tablename__ = "metrics"

    run: str = Field(primary_key=True)
    step: int = Field(primary_key=True)
    kind: str = Field(primary_key=True)
    """train, eval or push."""
    version: int = 0
    values: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)


class SchemaRow(SQLModel, table=True):
    __tablename__ = "schema_version"

    version: int = Field(primary_key=True)
    applied_at: datetime = Field(default_factory=utcnow)


def make_engine(url: str) -> Engine:
    """An engine for the archive URL; creates the schema (and the SQLite folder) on first use."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Workers starting at once on a fresh database would race to create the tables
            # (UniqueViolation on pg_type); SQLite's BEGIN IMMEDIATE already serialises them.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK})
        SQLModel.metadata.create_all(connection)
        _check_version(connection.execute(text("SELECT max(version) FROM schema_version")))
    with Session(engine) as session:
        _insert_ignore(session, SchemaRow, [{"version": SCHEMA_VERSION, "applied_at": utcnow()}])
        session.commit()
    return engine


def _check_version(result: Any) -> None:
    """Refuse an archive that a newer version has opened (see the module docstring)."""
    newest = result.scalar()
    if newest is not None and int(newest) > SCHEMA_VERSION:
        raise SchemaMismatch(
            f"the archive was written by archive schema version {newest}; this EvoEnv reads "
            f"versions up to {SCHEMA_VERSION}: run the EvoEnv that wrote it, or give this one "
            "a new archive (EVOENV_DATABASE_URL, or another EVOENV_DATA_DIR)"
        )


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # let the "begin" hook issue BEGIN IMMEDIATE
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=60000")
    # Switching to WAL takes an exclusive lock that the busy handler does not wait for when
    # several processes open a fresh file at once: retry it (it persists in the file).
    for attempt in range(200):
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 199:
                raise
            time.sleep(0.05 + 0.01 * attempt)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    # Take the write lock at the start: no deadlock upgrading a read transaction to a write.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _insert_ignore(session: Session, table: type[SQLModel], rows: Sequence[dict[str, Any]]) -> int:
    """INSERT ... ON CONFLICT DO NOTHING; returns how many rows were new."""
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(table).values(list(rows)).on_conflict_do_nothing()  # type: ignore[arg-type]
    if dialect == "postgresql":
        # The row count of this statement is -1 there: count the keys it returns instead.
        keys = table.__table__.primary_key.columns  # type: ignore[attr-defined]
        return len(session.execute(statement.returning(*keys)).all())
    result = session.execute(statement)
    return int(getattr(result, "rowcount", 0) or 0)


class Archive:
    """The archive's operations. Every write is idempotent by its key."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine) as session:
            yield session

    def add_environment(
        self,
        name: str,
        source: str,
        *,
        status: str = "candidate",
        origin: str = "user",
        parents: Sequence[str] = (),
    ) -> str:
        """Record an environment (once per source); returns its sha."""
        sha = source_sha(source)
        now = utcnow()
        row = {
            "sha": sha,
            "name": name,
            "source": source,
            "status": status,
            "origin": origin,
            "parents": list(parents),
            "stats": EnvStats(),
            "created_at": now,
            "updated_at": now,
        }
        with self.session() as session:
            _insert_ignore(session, EnvironmentRow, [row])
            session.commit()
        return sha

    def environment(self, sha: str) -> EnvironmentRow | None:
        with self.session() as session:
            return session.get(EnvironmentRow, sha)

    def environments(self, status: str | None = None) -> list[EnvironmentRow]:
        with self.session() as session:
            query = select(EnvironmentRow)
            if status is not None:
                query = query.where(EnvironmentRow.status == status)
            return list(session.exec(query.order_by(EnvironmentRow.created_at)))  # type: ignore[arg-type]

    def record_validation(
        self, job_id: str, env_sha: str, report: ValidationReport, *, adhoc: bool
    ) -> bool:
        """Store a validation report and its stages under the job id; False if already there."""
        row = {
            "job_id": job_id,
            "env_sha": env_sha,
            "file": report.file,
            "name": report.name,
            "verdict": report.verdict,
            "failed_stage": report.failed_stage,
            "adhoc": adhoc,
            "report": report.model_dump(mode="json"),
            "created_at": utcnow(),
        }
        stages = [
            {
                "job_id": job_id,
                "stage": s.stage,
                "ok": s.ok,
                "seconds": s.seconds,
                "detail": s.detail,
            }
            for s in report.stages
        ]
        with self.session() as session:
            new = _insert_ignore(session, ValidationRow, [row])
            if new:
                _insert_ignore(session, ValidationStageRow, stages)
            session.commit()
        return bool(new)

    def amend_validation(self, job_id: str, report: ValidationReport) -> bool:
        """Replace the stored report of `job_id` and its stages (a decision taken after it was
        recorded: a generated candidate's in-group comparison); False if none is stored."""
        with self.session() as session:
            row = session.get(ValidationRow, job_id)
            if row is None:
                return False
            row.verdict, row.failed_stage = report.verdict, report.failed_stage
            row.report = report.model_dump(mode="json")
            session.add(row)
            for stage in report.stages:
                kept = session.get(ValidationStageRow, (job_id, stage.stage))
                if kept is not None:
                    kept.ok, kept.detail = stage.ok, stage.detail
                    session.add(kept)
            session.commit()
        return True

    def validation(self, job_id: str) -> ValidationReport | None:
        with self.session() as session:
            row = session.get(ValidationRow, job_id)
            return None if row is None else ValidationReport.model_validate(row.report)

    def update_environment(
        self,
        sha: str,
        *,
        status: str | None = None,
        stats: EnvStats | None = None,
        embedding: dict[str, Any] | None = None,
    ) -> None:
        """Set the status, merge `stats` into the row's stats (each field its JSON holds takes
        its value: `EnvStats.merged`), and/or store its embeddings."""
        with self.session() as session:
            row = session.get(EnvironmentRow, sha, with_for_update=True)
            if row is None:
                raise KeyError(f"no environment {sha} in the archive")
            if status is not None:
                row.status = status
            if stats is not None:
                row.stats = row.stats.merged(stats)
            if embedding is not None:
                row.embedding = embedding
            row.updated_at = utcnow()
            session.add(row)
            session.commit()

    def by_name(
        self, name: str, statuses: Sequence[str] = ("seed", "admitted")
    ) -> EnvironmentRow | None:
        """The active environment called `name`, if any (names are unique in the pool)."""
        with self.session() as session:
            query = select(EnvironmentRow).where(EnvironmentRow.name == name)
            query = query.where(EnvironmentRow.status.in_(list(statuses)))  # type: ignore[attr-defined]
            return session.exec(query).first()

    def find(self, key: str) -> EnvironmentRow | None:
        """The environment `key` names: a full sha; else an environment called `key`
        (`latest_by_name`); else the one whose sha starts with `key` (at least
        `SHORT_SHA_MIN` hex digits, as `pool list` and the web page show them). None where
        none does; `UsageError` where the prefix starts several shas."""
        if FULL_SHA.fullmatch(key):
            return self.environment(key)
        named = self.latest_by_name(key)
        if named is not None or not SHORT_SHA.fullmatch(key):
            return named
        with self.session() as session:
            query = select(EnvironmentRow).where(col(EnvironmentRow.sha).startswith(key))
            rows = list(session.exec(query.limit(2)))
        if len(rows) > 1:
            raise UsageError(f"{key!r} starts more than one environment's sha: give more of it")
        return rows[0] if rows else None

    def latest_by_name(self, name: str) -> EnvironmentRow | None:
        """The environment called `name` that a person means: the active one (seed or
        admitted), else the most recently updated of that name (retired, rejected, ...)."""
        with self.session() as session:
            rows = list(session.exec(select(EnvironmentRow).where(EnvironmentRow.name == name)))
        active = [r for r in rows if r.status in {"seed", "admitted"}]
        ranked = active or sorted(rows, key=lambda r: r.updated_at)
        return ranked[-1] if ranked else None

    def record_metrics(
        self, run: str, step: int, kind: str, version: int, values: dict[str, Any]
    ) -> None:
        """One row of metrics per (run, step, kind): a step trained again after a resume from an
        earlier checkpoint replaces the row of the attempt that was lost."""
        now = utcnow()
        row = {
            "run": run,
            "step": step,
            "kind": kind,
            "version": version,
            "values": values,
            "created_at": now,
        }
        with self.session() as session:
            dialect = session.get_bind().dialect.name
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            statement = insert(MetricRow).values([row])  # type: ignore[arg-type]
            statement = statement.on_conflict_do_update(
                index_elements=["run", "step", "kind"],
                set_={"version": version, "values": values, "created_at": now},
            )
            session.execute(statement)
            session.commit()

    def keep_last_metrics(self, run: str, kind: str, steps: int) -> None:
        """Forget the rows of `kind` in `run` older than its `steps` latest steps."""
        with self.session() as session:
            query = select(MetricRow.step).where(MetricRow.run == run, MetricRow.kind == kind)
            latest = list(session.exec(query.order_by(col(MetricRow.step).desc()).limit(steps)))
            if len(latest) < steps:
                return
            old = select(MetricRow).where(
                MetricRow.run == run, MetricRow.kind == kind, MetricRow.step < latest[-1]
            )
            for row in session.exec(old):
                session.delete(row)
            session.commit()

    def runs_with(self, kind: str) -> list[str]:
        """The runs that recorded metrics of `kind`, in name order."""
        with self.session() as session:
            query = select(MetricRow.run).where(MetricRow.kind == kind).distinct()
            return sorted(session.exec(query))

    def metrics(self, run: str, kind: str | None = None) -> list[MetricRow]:
        with self.session() as session:
            query = select(MetricRow).where(MetricRow.run == run)
            if kind is not None:
                query = query.where(MetricRow.kind == kind)
            return list(session.exec(query.order_by(MetricRow.step)))  # type: ignore[arg-type]
