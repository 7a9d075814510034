"""The `evoenv` command. Each command group lives in its own module; heavy imports are late."""

from __future__ import annotations

import io
import sys

import typer
from pydantic import ValidationError
from typer.exceptions import TyperException

from evoenv_cli import cluster, envs, pool, report, training, up
from evoenv_cli import model as model_cli
from evoenv_cli.help_pages import command
from evoenv_cli.terminal_text import plain
from evoenv_worker import __version__
from shared.config import Settings
from shared.errors import UsageError
from shared.logging import configure_logging

app = typer.Typer(
    name="evoenv",
    help="EvoEnv: self-improving reasoning RL by environment synthesis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
envs.register(app)
cluster.register(app)
model_cli.register(app)
training.register(app)
pool.register(app)
report.register(app)
up.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"evoenv {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show info-level log lines."),
) -> None:
    """Settings come from EVOENV_* environment variables (see docs/settings.md)."""
    try:
        settings = Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "EVOENV_" + "__".join(str(part) for part in first["loc"]).upper()
        raise UsageError(f"bad setting {where}: {first['msg']}") from exc
    configure_logging(settings.log_format, "INFO" if verbose else "WARNING")
    ctx.obj = settings


def main() -> None:
    """The console script: usage errors are one line on stderr and exit code 2. Text that
    cannot be written in the terminal's encoding is written as escapes, never an error."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = command(app)(standalone_mode=False, prog_name="evoenv")
    except UsageError as exc:
        typer.echo(f"error: {plain(exc)}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except TyperException as exc:  # typer's command-line parsing errors
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            sys.exit(0)
        where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(f"error: {plain(message)}{where}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
