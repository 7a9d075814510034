"""`evoenv seeds`, `evoenv sample` and `evoenv validate`: environments, run in the sandbox."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import structlog
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evoenv_cli.source_file import read_source, source_text
from evoenv_cli.terminal_text import cell, plain, print_table, whole_column
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.environment import MAX_SEED, build_prompt
from shared.errors import SandboxFailure, SandboxUnavailable, UsageError
from shared.messages import ValidationReport

log = structlog.get_logger(__name__)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_ADMITTED, EXIT_REJECTED, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


def register(app: typer.Typer) -> None:
    app.command("seeds")(seeds)
    app.command("sample")(sample)
    app.command("validate")(validate)


def seed_files(settings: Settings) -> list[Path]:
    files = sorted(settings.seeds_dir.glob("*.py"))
    if not files:
        raise UsageError(f"no seed environments in {settings.seeds_dir}")
    return files


def resolve_env(settings: Settings, env: str) -> Path:
    """A file path, or the name of a seed (a regular file of that path wins over a seed)."""
    path = Path(env)
    if _is_file(path):
        return path
    seed = settings.seeds_dir / f"{env}.py"
    if seed.is_file():
        return seed
    if _is_there(path):  # a directory, a FIFO, a file behind a folder this user cannot enter
        return path
    names = ", ".join(p.stem for p in seed_files(settings))
    raise UsageError(f"unknown environment {env!r}: give a file path or a seed name ({names})")


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _is_there(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # there, but out of reach: reading it says why
    return True


def _sandbox_or_exit(settings: Settings) -> Sandbox:
    sandbox = Sandbox(settings.sandbox)
    try:
        sandbox.start()
    except SandboxUnavailable as exc:
        err.print(f"error: {plain(exc)}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc
    return sandbox


def _describe(sandbox: Sandbox, path: Path, source: str) -> dict[str, Any]:
    (result,) = sandbox.run(source, [{"op": "describe"}], filename=path.name)
    if not result.ok:
        raise UsageError(f"{path}: the environment cannot be loaded: {result.reason}")
    return dict(result.value)


def seeds(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per seed, one per line."),
) -> None:
    """List the seed environments: name, oracle kind, difficulty range, description."""
    settings: Settings = ctx.obj
    rows = []
    with _sandbox_or_exit(settings) as sandbox:
        for path in seed_files(settings):
            source = source_text(path, path.read_bytes(), settings.validation.max_source_bytes)
            rows.append({"file": str(path), **_describe(sandbox, path, source)})
    if as_json:
        for row in rows:
            out.print(json.dumps(row), markup=False)
        return
    table = Table(title=f"{len(rows)} seed environments")
    whole_column(table, "name", [row["name"] for row in rows])
    whole_column(table, "oracle", [row["oracle"] for row in rows])
    whole_column(
        table, "difficulty", [f"{r['min_difficulty']}-{r['max_difficulty']}" for r in rows]
    )
    table.add_column("description")
    for row in rows:
        table.add_row(
            cell(row["name"]),
            cell(row["oracle"]),
            cell(f"{row['min_difficulty']}-{row['max_difficulty']}"),
            cell(row["description"]),
        )
    print_table(out, table)


def sample(
    ctx: typer.Context,
    env: str = typer.Argument(..., help="A seed name or an environment file."),
    seed: int = typer.Option(0, "--seed", "-s", min=0, max=MAX_SEED, help="Instance seed."),
    difficulty: int | None = typer.Option(
        None, "--difficulty", "-d", help="Difficulty (default: the middle of the range)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Sample one instance: the prompt the solver sees, the reference and its answer text."""
    settings: Settings = ctx.obj
    path = resolve_env(settings, env)
    limit = settings.validation.max_source_bytes
    source = source_text(path, read_source(path, limit), limit)
    with _sandbox_or_exit(settings) as sandbox:
        meta = _describe(sandbox, path, source)
        lo, hi = meta["min_difficulty"], meta["max_difficulty"]
        level = (lo + hi) // 2 if difficulty is None else difficulty
        if not lo <= level <= hi:
            raise UsageError(f"difficulty {level} is outside {meta['name']}'s range {lo}-{hi}")
        op = {"op": "instance", "seed": seed, "difficulty": level}
        (result,) = sandbox.run(source, [op], filename=path.name)
    if not result.ok:
        err.print(
            f"error: {plain(meta['name'])} failed at seed {seed}, difficulty {level}: "
            f"{plain(result.reason)}",
            markup=False,
        )
        raise typer.Exit(1)
    value = result.value
    record = {
        "env": meta["name"],
        "seed": seed,
        "difficulty": level,
        "prompt": build_prompt(value["prompt"]),
        "reference": value["reference"],
        "answer_text": value["answer_text"],
        "instance": value["instance"],
        "isolated": sandbox.isolated,
    }
    if as_json:
        out.print(json.dumps(record), markup=False)
        return
    out.rule(Text(f"{plain(meta['name'])}  seed {seed}  difficulty {level}"))
    out.print(plain(record["prompt"], lines=True), markup=False)
    out.rule("reference")
    out.print(json.dumps(value["reference"]), markup=False)
    out.print(f"answer text: {plain(value['answer_text'])}", markup=False)


def validate(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(
        ..., help="Environment files to validate.", exists=False, readable=False, dir_okay=True
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per file, one per line."),
    queue: bool = typer.Option(False, "--queue", help="Run as jobs on the cluster's queues."),
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="With --queue: wait for the reports, or print the job ids."
    ),
    review: bool = typer.Option(False, "--review", help="Add the semantic self-review (model)."),
    calibrate: bool = typer.Option(
        False, "--calibrate", help="Add difficulty calibration (model)."
    ),
    novelty: bool = typer.Option(
        False, "--novelty", help="Add the novelty check against the pool."
    ),
    all_stages: bool = typer.Option(
        False, "--all", help="All stages: L1-L5, review, calibration, novelty."
    ),
) -> None:
    """Run the admission stages on environment files (never adds them to the pool).

    L1-L5 by default (no model needed); the model stages run against the configured vLLM
    server (with --queue, any of them runs all three). Exit code: 0 all admitted, 1 any
    rejected, 3 any check could not run, 2 bad usage.
    """
    settings: Settings = ctx.obj
    wanted = [
        s
        for s, on in (("review", review), ("calibration", calibrate), ("novelty", novelty))
        if on or all_stages
    ]
    limit = settings.validation.max_source_bytes
    blobs = [(path, read_source(path, limit)) for path in files]
    if queue:
        from evoenv_cli.cluster import validate_on_queue

        reports = validate_on_queue(settings, blobs, as_json, wait, model_stages=bool(wanted))
        raise typer.Exit(exit_code(reports) if wait else 0)
    reports = validate_locally(settings, blobs, wanted, as_json)
    raise typer.Exit(exit_code(reports))


def validate_locally(
    settings: Settings,
    blobs: list[tuple[Path, bytes]],
    wanted: list[str],
    as_json: bool,
    add_to_pool: bool = False,
) -> list[ValidationReport]:
    """Validate each file in this process, printing each report as it is done."""
    import uuid

    from evoenv_cli.services import missing_service
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.mechanical import validate_source
    from evoenv_worker.verdict import conclude, run_locally
    from shared.messages import ValidateJob

    if wanted or add_to_pool:  # the Redis of a running `evoenv up`, unless one is set
        from evoenv_cli.up_record import choose_redis

        settings = settings.model_copy(update={"redis_url": choose_redis(settings).redis_url})
    context = WorkerContext(settings)
    reports: list[ValidationReport] = []
    asked, missing = False, None  # asked once, at the first file that passes L1-L5
    try:
        for path, data in blobs:
            progress = _progress(path) if sys.stderr.isatty() and not as_json else None
            report: ValidationReport | None = None
            try:
                report = validate_source(data, str(path), context.sandbox(), settings, progress)
                job = ValidateJob.for_file(
                    str(uuid.uuid4()), str(path), data, add_to_pool=add_to_pool
                )
                if (wanted or add_to_pool) and report.verdict == "admitted":
                    if not asked:
                        asked, missing = True, missing_service(settings, wanted, add_to_pool)
                    if missing is not None:
                        report = _errored(path, missing, report)
                    elif wanted:
                        report = run_locally(context, job, report, wanted)
                if add_to_pool and report.verdict != "error":
                    report = conclude(context, job, report, in_redis=False)
            except (SandboxUnavailable, SandboxFailure) as exc:
                report = _errored(path, str(exc), report)
            except Exception as exc:  # one file's failure never takes the others' reports down
                log.info("validation_failed", file=str(path), exc_info=True)  # with --verbose
                report = _errored(path, f"{type(exc).__name__}: {str(exc)[:500]}", report)
            if progress is not None:
                err.file.write("\r\033[K")
            reports.append(report)
            if as_json:
                out.print(json.dumps(report.public()), markup=False)
            else:
                print_report(report)
    finally:
        context.close()
    return reports


def _errored(path: Path, error: str, report: ValidationReport | None) -> ValidationReport:
    """The report of a file whose check could not run or failed (never the file's fault): the
    stages it passed kept, and whether they ran confined; with none run, nothing ran unconfined."""
    if report is None:
        return ValidationReport(
            file=str(path), name=None, verdict="error", failed_stage=None, stages=[], error=error
        )
    return report.model_copy(update={"verdict": "error", "failed_stage": None, "error": error})


def exit_code(reports: list[ValidationReport]) -> int:
    """0 when every file is admitted, 1 when any is rejected, 3 when any check could not run."""
    verdicts = {r.verdict for r in reports}
    if "error" in verdicts:
        return EXIT_ERROR
    return EXIT_REJECTED if "rejected" in verdicts else EXIT_ADMITTED


def _progress(path: Path) -> Any:
    done: list[str] = []

    def step(stage: str) -> None:
        done.append(stage)
        err.file.write(f"\r\033[K{plain(path)}: {' '.join(done)} ...")
        err.file.flush()

    return step


def print_report(report: ValidationReport) -> None:
    """The readable report of one file."""
    seconds = sum(stage.seconds for stage in report.stages)
    style = {"admitted": "bold green", "rejected": "bold red", "error": "bold yellow"}[
        report.verdict
    ]
    where = f" at {report.failed_stage}" if report.failed_stage else ""
    out.print(
        Text.assemble(
            (f"{report.verdict.upper()}{where}", style),
            f"  {plain(report.file)}  ({plain(report.name or 'unnamed')}, {seconds:.2f} s)",
        )
    )
    if not report.isolated:
        out.print(
            "  [bold yellow]WARNING: the sandbox ran unconfined: this code was NOT isolated[/]"
        )
    if report.error:
        out.print(f"  error: {plain(report.error)}", markup=False)
    for stage in report.stages:
        mark = "[green]ok  [/]" if stage.ok else "[red]FAIL[/]"
        out.print(f"  {stage.stage:<11} {mark} {stage.seconds:6.2f} s  ", end="")
        out.print(plain(stage.detail), markup=False)
        if stage.trigger is not None and not stage.ok:
            trigger = stage.trigger.model_dump(exclude_none=True)
            out.print(f"{'':23}triggered by {json.dumps(trigger)}", markup=False)
