"""`evoenv report`: a run's figures and Markdown summary, written from the archive."""

from __future__ import annotations

from pathlib import Path

import typer

from evoenv_cli.envs import err, out
from evoenv_cli.terminal_text import plain
from shared.config import Settings


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    ctx: typer.Context,
    run: str | None = typer.Argument(None, help="The run (default: the configured EVOENV_RUN)."),
    folder: Path | None = typer.Option(
        None, "--out", "-o", help="Where to write the report (default: RUN_FOLDER/report)."
    ),
) -> None:
    """Plot a run's rewards, evaluations, funnel, pool, pushes and throughput, with report.md.

    The PNGs and report.md go to RUN_FOLDER/report unless --out says where."""
    from evoenv_cli.run_report import recorded_runs, write_report
    from shared.db import Archive

    settings: Settings = ctx.obj
    name = run or settings.run
    run_dir = settings.run_dir if name == settings.run else settings.data_dir / "runs" / name
    archive = Archive(settings.archive_url)
    files = write_report(archive, name, folder or run_dir / "report", run_dir=run_dir)
    if not archive.metrics(name):
        others = plain(", ".join(recorded_runs(archive))) or "none"
        err.print(
            f"note: no metrics recorded for run {name!r} yet (runs in the archive: {others})",
            markup=False,
        )
    for path in files.paths:
        out.print(plain(path), markup=False)
