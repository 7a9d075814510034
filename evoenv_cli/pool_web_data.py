"""What the pages of `evoenv pool serve` show, read from the archive: the pool's rows, an
environment's reports, lineage and pass-rate history, and the run's admission funnel."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sqlmodel import select

from evoenv_cli.pool import _rate, _summary
from shared.db import ENV_STATUSES, Archive, EnvironmentRow, ValidationRow
from shared.messages import MECHANICAL_STAGES, MODEL_STAGES, StageReport, ValidationReport

FUNNEL_ORDER: tuple[str, ...] = (
    *MECHANICAL_STAGES,
    *MODEL_STAGES,
    "name clash",
    "error",
    "expired",
    "admitted",
)
"""Where a candidate stops, in the order the funnel shows them: the admission stages (as
`run_report.FUNNEL_STAGES`), then the outcomes besides (`shared.env_stats.ArchivedFunnel`)."""
SPARK_WIDTH, SPARK_HEIGHT = 240, 48


@dataclass(frozen=True)
class PoolRow:
    sha: str
    name: str
    status: str
    origin: str
    serving_difficulty: int | None
    calibration: str
    uses: int
    env_error_rate: str


def pool_rows(archive: Archive, status: str | None) -> tuple[list[PoolRow], dict[str, int]]:
    """Every environment (of `status`, if given), oldest first, and the count of each status
    (from the same read)."""
    every = archive.environments()
    counts = dict.fromkeys(ENV_STATUSES, 0)
    for row in every:
        counts[row.status] = counts.get(row.status, 0) + 1
    return [pool_row(r) for r in every if status is None or r.status == status], counts


def pool_row(row: EnvironmentRow) -> PoolRow:
    summary = _summary(row)
    errors, gradings = row.stats.env_errors, row.stats.gradings
    return PoolRow(
        sha=row.sha,
        name=row.name,
        status=row.status,
        origin=row.origin,
        serving_difficulty=summary["serving_difficulty"],
        calibration=_rate(summary["calibration"]),
        uses=summary["uses"],
        env_error_rate=f"{errors / gradings:.2f} ({errors}/{gradings})" if gradings else "-",
    )


@dataclass(frozen=True)
class Link:
    href: str
    label: str


@dataclass(frozen=True)
class StoredReport:
    job_id: str
    env_sha: str
    created_at: str
    adhoc: bool
    report: ValidationReport

    @property
    def stopping(self) -> StageReport | None:
        """The stage that stopped the candidate, if one did."""
        return next(
            (s for s in self.report.stages if s.stage == self.report.failed_stage and not s.ok),
            None,
        )


def reports_of(archive: Archive, sha: str) -> list[StoredReport]:
    """The validation reports of the environment `sha`, oldest first."""
    with archive.session() as session:
        query = select(ValidationRow).where(ValidationRow.env_sha == sha)
        rows = list(session.exec(query.order_by(ValidationRow.created_at)))  # type: ignore[arg-type]
    return [_stored(row) for row in rows]


def report_by_job(archive: Archive, job_id: str) -> StoredReport | None:
    with archive.session() as session:
        row = session.get(ValidationRow, job_id)
    return None if row is None else _stored(row)


def _stored(row: ValidationRow) -> StoredReport:
    report = ValidationReport.model_validate(row.report)
    return StoredReport(row.job_id, row.env_sha, row.created_at.isoformat(), row.adhoc, report)


@dataclass(frozen=True)
class Lineage:
    parents: list[Link]
    children: list[Link]


def lineage(archive: Archive, row: EnvironmentRow) -> Lineage:
    """Parents (by sha, named when the archive has them) and the environments that name this
    one as a parent."""
    everyone = {r.sha: r for r in archive.environments()}
    parents = [
        Link(f"/env/{sha}", everyone[sha].name if sha in everyone else f"{sha[:12]} (not stored)")
        for sha in row.parents
    ]
    children = [Link(f"/env/{r.sha}", r.name) for r in everyone.values() if row.sha in r.parents]
    return Lineage(parents, children)


@dataclass(frozen=True)
class Search:
    at: str
    level: int
    pass_rate: float | None
    curve: str


@dataclass(frozen=True)
class History:
    searches: list[Search]
    sparkline: str
    """The `points` of an SVG polyline of the pass rate at each chosen level (numbers only;
    empty with fewer than two)."""


def history(row: EnvironmentRow) -> History:
    searches = []
    for search in row.stats.pass_rate_history:
        curve = sorted(search.curve.items(), key=lambda item: _level(item[0]))
        searches.append(
            Search(
                at=search.at,
                level=search.level,
                pass_rate=search.curve.get(str(search.level)),
                curve=", ".join(f"{level}: {rate:.2f}" for level, rate in curve),
            )
        )
    rates = [s.pass_rate for s in searches if s.pass_rate is not None]
    points = ""
    if len(rates) >= 2:
        step = SPARK_WIDTH / (len(rates) - 1)
        points = " ".join(
            f"{i * step:.1f},{(1 - min(max(r, 0.0), 1.0)) * (SPARK_HEIGHT - 4) + 2:.1f}"
            for i, r in enumerate(rates)
        )
    return History(searches, points)


def _level(text: str) -> int:
    return int(text) if text.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class Candidate:
    """One candidate of the run's admission funnel and where it stopped."""

    sha: str
    name: str
    stage: str
    href: str
    detail: str = ""
    trigger: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Funnel:
    counts: list[tuple[str, int]]
    """(stage, candidates that stopped there), in `FUNNEL_ORDER`, then any other outcome."""
    candidates: list[Candidate]

    @property
    def total(self) -> int:
        return len(self.candidates)


def funnel(archive: Archive) -> Funnel:
    """The run's candidates by where they stopped. A candidate is an environment judged by the
    run's admission (a validation report not made ad hoc: generated candidates), or an
    archived environment that is generated or rejected; its outcome is the one its archive row
    keeps (`stats.funnel`), else its latest report's (the failed stage, `admitted`, `expired` or
    `error`)."""
    with archive.session() as session:
        query = select(ValidationRow).where(ValidationRow.adhoc == False)  # noqa: E712
        rows = list(session.exec(query.order_by(ValidationRow.created_at)))  # type: ignore[arg-type]
    latest = {row.env_sha: _stored(row) for row in rows}
    envs = {row.sha: row for row in archive.environments()}
    candidates = [_candidate(sha, stored, envs.get(sha)) for sha, stored in latest.items()]
    candidates += [
        _candidate(sha, None, row)
        for sha, row in envs.items()
        if sha not in latest and (row.origin == "generated" or row.status == "rejected")
    ]
    found: dict[str, int] = {}
    for candidate in candidates:
        found[candidate.stage] = found.get(candidate.stage, 0) + 1
    order = [*FUNNEL_ORDER, *sorted(set(found) - set(FUNNEL_ORDER))]
    return Funnel([(stage, found.get(stage, 0)) for stage in order], candidates)


def _candidate(sha: str, stored: StoredReport | None, row: EnvironmentRow | None) -> Candidate:
    """A candidate from its latest report and/or its archive row (one of them at least)."""
    stopping = stored.stopping if stored is not None else None
    stage: str
    if row is not None and row.stats.funnel:
        stage = row.stats.funnel
    elif stored is not None:
        stage = _outcome(stored.report)
    else:
        stage = "admitted" if row is not None and row.stats.admitted_at is not None else "unknown"
    if row is not None:
        name, href = row.name, f"/env/{sha}"
    elif stored is not None:
        name, href = (
            stored.report.name or stored.report.file,
            f"/report/{quote(stored.job_id, safe='')}",
        )
    else:
        name, href = sha[:12], f"/env/{sha}"
    if stopping is not None:
        detail = stopping.detail
    else:
        detail = (stored.report.error or "") if stored is not None else ""
    trigger = {}
    if stopping is not None and stopping.trigger is not None:
        trigger = stopping.trigger.model_dump(exclude_none=True)
    return Candidate(sha, name, stage, href, detail, trigger)


def _outcome(report: ValidationReport) -> str:
    if report.verdict == "rejected":
        return report.failed_stage or "unknown"
    if report.verdict == "error":
        return "expired" if (report.error or "").startswith("expired") else "error"
    return "admitted"


@dataclass(frozen=True)
class StepSummary:
    """One step of a run, as its samples row gives it."""

    step: int
    version: int
    samples: int
    roles: str
    """How many samples of each role, e.g. "6 solver, 2 generator"."""
    mean_reward: float | None


def run_steps(archive: Archive, run: str) -> list[StepSummary]:
    """The steps of `run` whose samples the archive keeps, newest first."""
    summaries = []
    for row in reversed(archive.metrics(run, "samples")):
        samples = _samples_of(row.values)
        roles = Counter(str(s.get("role")) for s in samples)
        rewards = [s["reward"] for s in samples if isinstance(s.get("reward"), (int, float))]
        summaries.append(
            StepSummary(
                step=row.step,
                version=row.version,
                samples=len(samples),
                roles=", ".join(f"{n} {role}" for role, n in sorted(roles.items())),
                mean_reward=sum(rewards) / len(rewards) if rewards else None,
            )
        )
    return summaries


def samples_of_step(archive: Archive, run: str, step: int) -> list[dict[str, Any]] | None:
    """The samples of `step` in `run` (None: the archive keeps none), each with `report`: the
    link to its candidate's validation report where one is stored (generator samples)."""
    rows = [row for row in archive.metrics(run, "samples") if row.step == step]
    if not rows:
        return None
    samples = _samples_of(rows[0].values)
    for sample in samples:
        job_id, link = sample.get("job_id"), None
        if isinstance(job_id, str) and report_by_job(archive, job_id) is not None:
            link = f"/report/{quote(job_id, safe='')}"
        sample["report"] = link
    return samples


def _samples_of(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The sample objects of a samples row (anything else in it skipped)."""
    samples = values.get("samples")
    return [s for s in samples if isinstance(s, dict)] if isinstance(samples, list) else []
