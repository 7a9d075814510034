"""`evoenv pool list|show|add|export|retire`: the admitted environments in the archive."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from evoenv_cli.envs import err, exit_code, out, print_report
from evoenv_cli.source_file import read_source
from evoenv_cli.terminal_text import SHOWN_SHA, cell, plain, print_table, whole_column
from shared.config import Settings, mask_url
from shared.errors import UsageError

if TYPE_CHECKING:
    from shared.db import EnvironmentRow

app = typer.Typer(help="The pool of admitted environments.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="pool")


def _archive(settings: Settings) -> Any:
    from evoenv_learner.pool import seed_pool
    from shared.db import Archive

    archive = Archive(settings.archive_url)
    seed_pool(archive, settings.seeds_dir)
    return archive


def _find(archive: Any, name: str) -> Any:
    """The environment `name` names: a name, a sha or the start of one (`Archive.find`)."""
    row = archive.find(name)
    if row is None:
        raise UsageError(
            f"no environment called {name!r} or with a sha starting so in the archive "
            "(see: evoenv pool list)"
        )
    return row


@app.command("list")
def list_pool(
    ctx: typer.Context,
    every: bool = typer.Option(False, "--all", help="Also rejected, retired and quarantined ones."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per environment."),
) -> None:
    """The active pool (seeds and admitted environments) with their difficulties and use."""
    err.print(archive_line(ctx.obj), markup=False)
    archive = _archive(ctx.obj)
    rows = [r for r in archive.environments() if every or r.status in {"seed", "admitted"}]
    if as_json:
        for r in rows:
            out.print(json.dumps(_summary(r)), markup=False)
        return
    table = Table(title=f"{len(rows)} environments")
    cells = []
    for r in rows:
        s = _summary(r)
        cells.append(
            (
                s["name"],
                s["status"],
                s["origin"],
                str(s["serving_difficulty"] or "-"),
                _rate(s["calibration"]),
                str(s["uses"]),
                str(s["env_errors"]),
                s["sha"][:SHOWN_SHA],
            )
        )
    headers = ("name", "status", "origin", "serving", "calibration", "uses", "env errors", "sha")
    for i, header in enumerate(headers):
        whole_column(table, header, [row[i] for row in cells])
    for row in cells:
        table.add_row(cell(row[0]), *row[1:])
    print_table(out, table)


def archive_line(settings: Settings) -> str:
    """Which archive the pool is read from, and why, for stderr. The pool lives in the archive
    alone (no Redis is read), which a running `evoenv up` of the same data folder shares."""
    if settings.database_url:
        why = "set by EVOENV_DATABASE_URL"
    else:
        why = f"the default in the data folder {settings.data_dir}"
    return f"archive: {mask_url(settings.archive_url)} ({why})"


def _summary(row: EnvironmentRow) -> dict[str, Any]:
    stats = row.stats
    return {
        "name": row.name,
        "sha": row.sha,
        "status": row.status,
        "origin": row.origin,
        "parents": row.parents,
        "serving_difficulty": stats.serving_difficulty,
        "calibration": stats.to_json().get("calibration"),
        "uses": stats.uses,
        "env_errors": stats.env_errors,
        "created_at": row.created_at.isoformat(),
    }


def _rate(calibration: Any) -> str:
    if not isinstance(calibration, dict) or calibration.get("pass_rate") is None:
        return "-"
    where = calibration.get("difficulty")
    return f"{calibration['pass_rate']:.2f} @ {'?' if where is None else where}"


@app.command("show")
def show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Environment name, sha or its start (6+ digits)."),
) -> None:
    """Lineage (parents), the validation report and the pass-rate history of one environment."""
    from sqlmodel import select

    from shared.db import ValidationRow

    archive = _archive(ctx.obj)
    row = _find(archive, name)
    with archive.session() as session:
        reports = list(session.exec(select(ValidationRow).where(ValidationRow.env_sha == row.sha)))
        parents = [archive.environment(p) for p in row.parents]
    out.print(
        json.dumps(
            {
                **_summary(row),
                "parents": [
                    p.name if p else sha for p, sha in zip(parents, row.parents, strict=True)
                ],
                "stats": {k: v for k, v in row.stats.to_json().items() if k != "recent_groups"},
            },
            indent=2,
            default=str,
        ),
        markup=False,
    )
    for report in reports[-1:]:
        from shared.messages import ValidationReport

        print_report(ValidationReport.model_validate(report.report))


@app.command("add")
def add(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(
        ..., help="Environment files.", exists=False, readable=False
    ),
    queue: bool = typer.Option(False, "--queue", help="Run the admission as jobs on the cluster."),
    as_json: bool = typer.Option(False, "--json", help="One JSON report per file."),
) -> None:
    """Run the full admission (L1-L5, review, calibration, novelty) and add what passes."""
    settings: Settings = ctx.obj
    limit = settings.validation.max_source_bytes
    blobs = [(path, read_source(path, limit)) for path in files]
    archive = _archive(settings)
    for path, data in blobs:
        from shared.static import check_static

        static = check_static(data, limit)
        clash = archive.by_name(static.name) if static.name else None
        if clash is not None:
            raise UsageError(f"{path}: the pool already has an environment called {static.name!r}")
    stages = ["review", "calibration", "novelty"]
    if queue:
        from evoenv_cli.cluster import validate_on_queue

        reports = validate_on_queue(
            settings, blobs, as_json, True, model_stages=True, add_to_pool=True
        )
    else:
        from evoenv_cli.envs import validate_locally

        reports = validate_locally(settings, blobs, stages, as_json, add_to_pool=True)
    raise typer.Exit(exit_code(reports))


@app.command("export")
def export(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="Folder to write into."),
    fmt: str = typer.Option(
        "files",
        "--format",
        help="files (NAME.py + pool.json), reasoning-gym (a package), verifiers (the package as "
        "a verifiers environment too) or jsonl.",
    ),
    seeds_only: bool = typer.Option(False, "--seeds-only", help="Only the seeds."),
    admitted_only: bool = typer.Option(False, "--admitted-only", help="Only admitted ones."),
    difficulty: list[str] = typer.Option(
        [], "--difficulty", "-d", help="Level or LO-HI (jsonl: repeatable); default: serving."
    ),
    count: int | None = typer.Option(
        None, "--count", "-n", help="jsonl: instances per environment and difficulty (100)."
    ),
    split: str | None = typer.Option(
        None, "--split", help="jsonl: train (default) or eval (the held-out seeds)."
    ),
) -> None:
    """Write the seeds and admitted environments for use outside EvoEnv.

    As files (the default), as an installable package of reasoning-gym-style datasets, the same
    package as a verifiers environment too, or as JSON lines of fixed instances
    (docs/commands.md)."""
    from evoenv_cli.pool_export import export_pool, export_request

    request = export_request(
        folder,
        fmt,
        seeds_only=seeds_only,
        admitted_only=admitted_only,
        difficulty=difficulty,
        count=count,
        split=split,
    )
    export_pool(ctx.obj, _archive(ctx.obj), request)


@app.command("serve")
def serve(
    ctx: typer.Context,
    host: str | None = typer.Option(
        None, "--host", help="Address to listen on (default 127.0.0.1; any other needs auth)."
    ),
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="TCP port (default 8100; 0: any free one)."
    ),
    user: str | None = typer.Option(None, "--user", help="Basic-auth user every page needs."),
    password_file: Path | None = typer.Option(
        None, "--password-file", help="The user's password, in a file (a final newline dropped)."
    ),
) -> None:
    """A read-only web page over the archive: the pool, each environment, the admission funnel."""
    from evoenv_cli.pool_web import serve_command

    serve_command(ctx.obj, host, port, user, password_file)


@app.command("retire")
def retire(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Environment name, sha or its start (6+ digits)."),
) -> None:
    """Retire an admitted environment (seeds cannot be retired)."""
    from evoenv_learner.pool import Pool

    settings: Settings = ctx.obj
    archive = _archive(settings)
    row = _find(archive, name)
    Pool(archive, settings.pool).retire(row.sha, "retired by hand")
    out.print(f"{plain(name)} retired", markup=False)
