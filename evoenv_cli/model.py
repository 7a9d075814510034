"""`evoenv model prepare|list` and `evoenv serve`: the policy's weights and its vLLM server."""

from __future__ import annotations

import signal
import time
from types import FrameType

import typer

from shared.config import Settings

app = typer.Typer(help="The policy's weights: prepare the embedded model.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    """Add `evoenv model ...` and `evoenv serve` to the root command (`evoenv_cli/__init__.py`)."""
    root.add_typer(app, name="model")
    root.command("serve")(serve)


@app.command("prepare")
def prepare(
    ctx: typer.Context,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the folder is ready."),
) -> None:
    """Make the configured model's bf16 safetensors folder (once) and print its path."""
    from evoenv_model.models import prepare_model

    settings: Settings = ctx.obj
    start = time.monotonic()
    folder = prepare_model(settings, force=force)
    typer.echo(f"{settings.model}: {folder} ({time.monotonic() - start:.1f} s)")


@app.command("list")
def list_models(ctx: typer.Context) -> None:
    """The embedded models (weights shipped by pip packages), and which are prepared."""
    from evoenv_model.models import DEFAULT_MODEL, EMBEDDED, is_prepared

    settings: Settings = ctx.obj
    for name in EMBEDDED:
        folder = settings.data_dir / "models" / name
        state = f"prepared at {folder}" if is_prepared(folder) else "not prepared"
        default = " (default)" if name == DEFAULT_MODEL else ""
        typer.echo(f"{name}{default}: {state}")


def serve(
    ctx: typer.Context,
    port: int | None = typer.Option(None, "--port", "-p", help="Port (EVOENV_SERVE__PORT)."),
    host: str | None = typer.Option(None, "--host", help="Address (EVOENV_SERVE__HOST)."),
) -> None:
    """Start vLLM's OpenAI-compatible server on the configured model, until stopped.

    Any address but loopback needs EVOENV_SERVE__API_KEY: every route but /health then asks
    for it as a bearer token."""
    from evoenv_model.models import prepare_model
    from evoenv_model.serve import dtype_choice, on_gpu, refuse_open_door, start_server

    settings: Settings = ctx.obj
    updates = {k: v for k, v in {"port": port, "host": host}.items() if v is not None}
    if updates:
        serve_settings = settings.serve.model_copy(update=updates)
        settings = settings.model_copy(update={"serve": serve_settings})
    refuse_open_door(settings)  # before the model is prepared: minutes on a first start
    folder = prepare_model(settings)
    server = start_server(settings, folder)

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise typer.Exit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    typer.echo(
        f"serving {settings.model} at {server.url}/v1 (OpenAI-compatible), "
        + dtype_choice(settings, gpu=on_gpu())
    )
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        code = 130
    finally:
        server.stop()
    if code:
        raise typer.Exit(code)
