"""Validate one environment file: L1 to L5 in order, stopping at the first failure.

`validate_source` is the plain function behind `evoenv validate` (local mode) and the
`validate` task.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog

from evoenv_worker import running_checks
from evoenv_worker.context import WorkerContext
from evoenv_worker.sandbox.host import OpResult, Sandbox
from shared.config import Settings
from shared.errors import EnvironmentOutputError, SandboxFailure, SandboxUnavailable
from shared.messages import Stage, StageReport, Trigger, ValidateJob, ValidationReport, Verdict
from shared.static import check_static
from shared.validation_seeds import validation_secret, validation_seeds

log = structlog.get_logger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SourceRunner:
    """A `running_checks.Runner` for one environment source in one sandbox."""

    sandbox: Sandbox
    source: str
    filename: str

    def run(self, ops: list[dict[str, Any]]) -> list[OpResult]:
        return self.sandbox.run(self.source, ops, filename=self.filename)


def validate_source(
    data: bytes, file: str, sandbox: Sandbox, settings: Settings, progress: Progress | None = None
) -> ValidationReport:
    """Run L1-L5 on the bytes of one file; the report names the first failing stage.

    A broken environment is a `rejected` report, never an exception: also when what it returned
    could not be used by a check (`EnvironmentOutputError`), which rejects it at the stage that
    was running, so crashing the validator never beats failing it. When the check itself cannot
    run (the sandbox cannot start or breaks down) or fails for a reason of the project's own
    (any other exception), the report says `error`, with the exception's type and message:
    never blamed on the file.
    """
    reports: list[StageReport] = []
    name: str | None = None

    def finish(
        verdict: Verdict, failed: Stage | None, error: str | None = None
    ) -> ValidationReport:
        report = ValidationReport(
            file=file,
            name=name,
            verdict=verdict,
            failed_stage=failed,
            stages=reports,
            isolated=sandbox.isolated,
            error=error,
        )
        log.info(
            "env_validated",
            file=file,
            env=name,
            verdict=verdict,
            failed_stage=failed,
            seconds=round(sum(s.seconds for s in reports), 3),
            isolated=sandbox.isolated,
        )
        return report

    def record(stage: Stage, check: running_checks.Check, started: float) -> bool:
        reports.append(
            StageReport(
                stage=stage,
                ok=check.ok,
                seconds=round(time.perf_counter() - started, 4),
                detail=check.detail,
                trigger=check.trigger,
                data=check.data,
            )
        )
        if progress is not None:
            progress(stage)
        return check.ok

    started = time.perf_counter()
    static = check_static(data, settings.validation.max_source_bytes)
    name = static.name
    if not record("L1", running_checks.Check(static.ok, static.detail), started):
        return finish("rejected", "L1")
    source = data.decode("utf-8-sig")
    runner = SourceRunner(sandbox, source, file)
    fresh = _fresh_factory(sandbox, source, file)
    seeds = validation_seeds(validation_secret(settings), data, settings.validation.seeds)
    stage: Stage = "L2"
    try:
        started = time.perf_counter()
        check, meta = running_checks.describe(runner)
        items: list[running_checks.Item] = []
        if meta is not None:
            check, items = running_checks.check_executes(runner, meta, seeds, settings.validation)
        if not record("L2", check, started) or meta is None:
            return finish("rejected", "L2")
        stage, started = "L3", time.perf_counter()
        cap = settings.validation.answer_cap
        if not record(
            "L3", running_checks.check_deterministic(fresh, items, answer_cap=cap), started
        ):
            return finish("rejected", "L3")
        stage, started = "L4", time.perf_counter()
        if not record(
            "L4", running_checks.check_l4(runner, items, meta, settings.validation), started
        ):
            return finish("rejected", "L4")
        stage, started = "L5", time.perf_counter()
        if not record(
            "L5", running_checks.check_scorer(runner, items, meta, settings.validation), started
        ):
            return finish("rejected", "L5")
    except EnvironmentOutputError as exc:
        trigger = Trigger(seed=exc.seed, difficulty=exc.difficulty) if exc.seed is not None else None
        record(stage, running_checks.Check(False, str(exc), trigger), started)
        return finish("rejected", stage)
    except (SandboxUnavailable, SandboxFailure) as exc:
        return finish("error", None, f"the sandbox could not run the check: {exc}")
    except Exception as exc:  # the project's own fault: this file's report says so, not the batch
        # The traceback for whoever reads the logs at INFO (a worker's); the report has the rest.
        log.info("validation_failed", file=file, stage=stage, exc_info=True)
        reason = f"{type(exc).__name__}: {str(exc)[:500]}"
        return finish("error", None, f"the check failed at {stage}: {reason}")
    return finish("admitted", None)


def _fresh_factory(sandbox: Sandbox, source: str, file: str) -> running_checks.FreshRunner:
    @contextmanager
    def fresh(hash_seed: int) -> Iterator[running_checks.Runner]:
        with Sandbox(sandbox.settings, hash_seed=hash_seed) as other:
            yield SourceRunner(other, source, file)

    return fresh


def validate_job(ctx: WorkerContext, job: ValidateJob) -> ValidationReport:
    """The `validate` job's mechanical part: L1-L5 in this worker's sandbox."""
    return validate_source(job.data, job.file, ctx.sandbox(), ctx.settings)
