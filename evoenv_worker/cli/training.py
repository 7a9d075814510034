"""`evoenv learner`, `evoenv export` and `evoenv eval`: the learner's side of the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.table import Table

from evoenv_worker.cli.envs import out
from shared.config import Settings


def register(app: typer.Typer) -> None:
    app.command("learner")(learner)
    app.command("export")(export)
    app.command("eval")(evaluate)


def learner(
    ctx: typer.Context,
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's last checkpoint."),
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimiser steps."),
) -> None:
    """Run the learner (orchestrator, trainer, weight pushes) until stopped or --steps."""
    from evoenv_learner.loop import run

    settings: Settings = ctx.obj
    if steps is not None:
        settings = settings.model_copy(
            update={"learner": settings.learner.model_copy(update={"steps": steps})}
        )
    state = asyncio.run(run(settings, resume=resume))
    out.print(f"stopped at step {state.step}, policy version {state.version}", markup=False)


def export(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="Where to write the Hugging Face folder."),
) -> None:
    """Write the trained policy (the run's last checkpoint) as a Hugging Face folder."""
    from evoenv_learner.loop import export as export_policy

    path = export_policy(ctx.obj, folder)
    out.print(f"policy written to {path}", markup=False)


def evaluate(
    ctx: typer.Context,
    env: list[str] = typer.Option(
        [], "--env", "-e", help="Environment names (default: the seeds)."
    ),
    difficulty: int | None = typer.Option(
        None, "--difficulty", "-d", help="Difficulty (default: serving)."
    ),
    instances: int = typer.Option(
        16, "--instances", "-n", help="Held-out instances per environment."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Pass rate of the served policy on held-out instances, with a 95 % interval."""
    from evoenv_learner.evaluate import evaluate as run_eval
    from evoenv_learner.orchestrator import Orchestrator
    from evoenv_learner.pool import Pool, seed_pool
    from evoenv_worker.app import configure
    from shared.db import Archive

    settings: Settings = ctx.obj
    _require_workers(settings, configure(settings))
    archive = Archive(settings.archive_url)
    seed_pool(archive, settings.seeds_dir)
    pool = Pool(archive, settings.pool)
    members = [m for m in pool.members if (m.name in env if env else m.is_seed)]
    missing = sorted(set(env) - {m.name for m in members})
    if missing:
        from shared.errors import UsageError

        raise UsageError(f"not in the pool: {', '.join(missing)}")

    async def backlog() -> int:
        return 0

    orchestrator = Orchestrator(settings, pool, backlog)
    result = asyncio.run(
        run_eval(settings, orchestrator, asyncio.Event(), members, difficulty, instances)
    )
    if not result["instances"]:
        from evoenv_worker.cli.envs import EXIT_ERROR, err

        err.print(
            "error: no instance was graded: every job failed (is the model server at "
            f"{', '.join(settings.vllm_urls)} up? see `evoenv status` and the workers' logs)",
            markup=False,
        )
        raise typer.Exit(EXIT_ERROR)
    if as_json:
        out.print(json.dumps(result), markup=False)
        return
    table = Table(title=f"held-out pass rate ({result['instances']} instances)")
    table.add_column("environment")
    table.add_column("pass rate")
    for key, value in result.items():
        if key.startswith("pass_rate_"):
            table.add_row(key.removeprefix("pass_rate_"), f"{value:.2f}")
    table.add_row(
        "all", f"{result['pass_rate']:.2f} [{result['ci_low']:.2f}, {result['ci_high']:.2f}]"
    )
    out.print(table)


def _require_workers(settings: Settings, app: object) -> None:
    """Exit with one line when no worker consumes a queue the evaluation's jobs need (they
    would wait forever)."""
    from evoenv_worker.cli.cluster import _redis_or_exit, workers_on
    from evoenv_worker.cli.envs import EXIT_ERROR, err
    from shared import keys

    _redis_or_exit(settings)
    consumed = {queue for queues in workers_on(app).values() for queue in queues}
    missing = [q for q in (keys.GRADING_QUEUE, keys.GENERATION_QUEUE) if q not in consumed]
    if missing:
        err.print(
            f"error: no worker is consuming the {', '.join(repr(q) for q in missing)} "
            f"queue(s); start one with deploy/worker.sh --queues {','.join(missing)}",
            markup=False,
        )
        raise typer.Exit(EXIT_ERROR)
