"""`evoenv learner`, `evoenv export` and `evoenv eval`: the learner's side of the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from evoenv_cli.envs import out
from evoenv_cli.learner_state import state_path, write_state
from evoenv_cli.terminal_text import cell, plain, print_table, whole_column
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
    """Run the learner (orchestrator, trainer, weight pushes) until stopped or --steps.

    Its state is kept in RUN/learner-state.json (at its start, each step, every few seconds and
    at a stop), which `evoenv up` shows. SIGUSR1 pushes the current weights again (a restarted
    model server serves the base weights)."""
    from evoenv_cli.envs import EXIT_ERROR, err
    from evoenv_cli.expiry import group_expiry
    from evoenv_learner.loop import run_process
    from shared.errors import EvoEnvError

    settings: Settings = ctx.obj
    if steps is not None:
        settings = settings.model_copy(
            update={"learner": settings.learner.model_copy(update={"steps": steps})}
        )
    keeper = StateKeeper(state_path(settings.run_dir))
    try:
        state = run_process(
            settings,
            resume=resume,
            expire_groups=group_expiry,
            on_start=keeper.started,
            on_step=keeper.write,
        )
    except EvoEnvError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc
    finally:
        keeper.close()
    if state is None:  # a follower rank under torchrun
        return
    out.print(f"stopped at step {state.step}, policy version {state.version}", markup=False)


class StateKeeper:
    """Keeps RUN/learner-state.json current: written at each call of `write` and, from
    `started` on, every `every` seconds by a thread (the in-flight counts move between steps)."""

    def __init__(self, path: Path, every: float = 5.0) -> None:
        self.path = path
        self.every = every
        self.state: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, state: Any) -> None:
        self.state = state
        self.write(state)
        self._thread = threading.Thread(target=self._run, name="learner-state", daemon=True)
        self._thread.start()

    def write(self, state: Any) -> None:
        with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: a dict changed meanwhile
            write_state(self.path, state)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.write(self.state)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.write(self.state)


def export(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="Where to write the Hugging Face folder."),
) -> None:
    """Write the trained policy (the run's last checkpoint) as a Hugging Face folder."""
    from evoenv_learner.loop import export as export_policy

    path = export_policy(ctx.obj, folder)
    out.print(f"policy written to {path}", markup=False)


class Suite(StrEnum):
    HELD_OUT = "held-out"
    REASONING_GYM = "reasoning-gym"


def evaluate(
    ctx: typer.Context,
    suite: Suite = typer.Option(
        Suite.HELD_OUT,
        "--suite",
        help="held-out: our environments' evaluation seeds, graded in the sandbox by the "
        "workers. reasoning-gym: tasks of the reasoning-gym package (fixed seed 42), scored "
        "in this process by its own scorers; needs only the model servers.",
    ),
    env: list[str] = typer.Option(
        [], "--env", "-e", help="Environment names (default: the seeds); held-out only."
    ),
    task: list[str] = typer.Option(
        [],
        "--task",
        "-t",
        help="reasoning-gym task names (default: basic_arithmetic, chain_sum, leg_counting, "
        "letter_counting, spell_backward, word_sorting); reasoning-gym only.",
    ),
    difficulty: int | None = typer.Option(
        None,
        "--difficulty",
        "-d",
        help="Difficulty (default: serving); held-out only (reasoning-gym tasks keep their "
        "default configurations).",
    ),
    instances: int = typer.Option(
        16, "--instances", "-n", min=1, help="Instances per environment or task."
    ),
    first: int = typer.Option(
        0,
        "--first",
        min=0,
        help="Start at this evaluation seed's index (0: the first), so that disjoint slices "
        "of the held-out instances can be used for tuning and for testing; held-out only.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Pass rate of the served policy on held-out instances, beside the best constant answer.

    Each environment's pass rate and the overall one, with a 95 % interval: strict (the answer
    in its tags, as training rewards it) and lenient (the tagged answer, else the last line;
    docs/CONTRACT.md). Beside each, the best constant answer (the one answer text that, given
    for every instance, passes most of them) and its score on the same instances. --json prints
    one object: its fields are in docs/commands.md.

    --suite reasoning-gym: pass rate and mean score on reasoning-gym tasks (exit 3: no server).
    """
    _check_options(suite, env, task, difficulty, first)
    if suite is Suite.REASONING_GYM:
        _evaluate_reasoning_gym(ctx.obj, task, instances, as_json)
        return
    result = _evaluate_held_out(ctx.obj, env, difficulty, instances, first)
    _print_result(result, as_json, _held_out_table)


def _check_options(
    suite: Suite, envs: list[str], tasks: list[str], difficulty: int | None, first: int
) -> None:
    """A usage error for an option that does not apply to `suite`."""
    from shared.errors import UsageError

    if suite is Suite.REASONING_GYM:
        if envs:
            raise UsageError(
                "--env does not apply to --suite reasoning-gym: name tasks with --task"
            )
        if first:
            raise UsageError("--first applies only to the held-out suite")
        if difficulty is not None:
            raise UsageError(
                "--difficulty does not apply to --suite reasoning-gym: its tasks are generated "
                "at their default configurations"
            )
    elif tasks:
        raise UsageError("--task applies only to --suite reasoning-gym")


def _evaluate_held_out(
    settings: Settings, envs: list[str], difficulty: int | None, instances: int, first: int
) -> dict[str, Any]:
    """`evoenv eval --suite held-out`: the pool's environments ENVS (default: the seeds) graded
    by the workers, on the Redis of the running `evoenv up` if there is one; exit 3 when the
    workers are missing or no instance was graded."""
    from evoenv_cli.cluster import redis_of_running_up
    from evoenv_learner import jobs
    from evoenv_learner.dispatch import SolverDispatch
    from evoenv_learner.held_out import evaluate as run_eval
    from evoenv_learner.levels import LevelTracker
    from evoenv_learner.pool import Pool, seed_pool
    from evoenv_worker.app import configure
    from shared.db import Archive
    from shared.errors import UsageError

    settings = redis_of_running_up(settings)
    _require_workers(settings, configure(settings))
    jobs.configure(settings)  # the solver dispatch sends the evaluation's jobs through it
    archive = Archive(settings.archive_url)
    seed_pool(archive, settings.seeds_dir)
    pool = Pool(archive, settings.pool)
    members = [m for m in pool.members if (m.name in envs if envs else m.is_seed)]
    missing = sorted(set(envs) - {m.name for m in members})
    if missing:
        raise UsageError(f"not in the pool: {', '.join(missing)}")

    solvers = SolverDispatch(settings, pool, LevelTracker(settings))
    result = asyncio.run(
        run_eval(
            settings,
            solvers,
            asyncio.Event(),
            members,
            difficulty,
            instances,
            baseline=True,
            first=first,
        )
    )
    _require_graded(settings, result)
    return result


def _require_graded(settings: Settings, result: dict[str, Any]) -> None:
    """Exit with one line when no instance of the evaluation was graded."""
    if not result["instances"]:
        from evoenv_cli.envs import EXIT_ERROR, err

        err.print(
            "error: no instance was graded: every job failed (is the model server at "
            f"{', '.join(settings.vllm_urls)} up? see `evoenv status` and the workers' logs)",
            markup=False,
        )
        raise typer.Exit(EXIT_ERROR)


def _print_result(
    result: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], Table]
) -> None:
    """`result` as one JSON object, or as its `table`."""
    if as_json:
        out.print(json.dumps(result), markup=False)
        return
    print_table(out, table(result))


CONSTANT_SHOWN = 24
"""Longest best constant answer the table shows whole (quoted); longer ones are cut."""


def _held_out_table(result: dict[str, Any]) -> Table:
    """Each environment's pass rate and interval, strict then lenient ("-": not measured),
    beside its best constant answer with that answer's score in brackets ("-": not found, or
    not computed)."""
    table = Table(title=f"held-out pass rate [95 % interval] ({result['instances']} instances)")
    whole_column(table, "environment", result["environments"])
    # numbers whole: on a narrow terminal the constant is cut, not a name nor an interval
    table.add_column("pass rate", no_wrap=True, min_width=len("0.00 [0.00, 0.00]"))
    table.add_column("lenient pass rate", no_wrap=True, min_width=len("0.00 [0.00, 0.00]"))
    table.add_column("constant (score)")
    for name, env in result["environments"].items():
        constant = env.get("best_constant")
        table.add_row(
            cell(name),
            _rate(env),
            _rate(env, "lenient_"),
            Text(plain(f"{_quoted(constant['answer'])} ({constant['score']:.2f})"))
            if constant
            else "-",
        )
    table.add_row("all", _rate(result), _rate(result, "lenient_"))
    return table


def _rate(summary: dict[str, Any], kind: str = "") -> str:
    """A pass rate and its interval: "0.50 [0.19, 0.81]"; `kind` "lenient_": the lenient one
    ("-" where there is none)."""
    if f"{kind}pass_rate" not in summary:
        return "-"
    rate, low, high = (summary[f"{kind}{key}"] for key in ("pass_rate", "ci_low", "ci_high"))
    return f"{rate:.2f} [{low:.2f}, {high:.2f}]"


def _quoted(answer: str) -> str:
    """`answer` cut to `CONSTANT_SHOWN` characters (then ending in "…"), quoted and escaped as
    a JSON string, so that spaces and newlines show."""
    shown = answer if len(answer) <= CONSTANT_SHOWN else f"{answer[:CONSTANT_SHOWN]}…"
    return json.dumps(shown, ensure_ascii=False)


def _evaluate_reasoning_gym(
    settings: Settings, tasks: list[str], instances: int, as_json: bool
) -> None:
    """`evoenv eval --suite reasoning-gym`: a progress bar on stderr, then the table or JSON."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from evoenv_cli.envs import EXIT_ERROR, err
    from evoenv_learner.reasoning_gym_eval import DEFAULT_TASKS, check_tasks, evaluate_suite
    from shared.errors import ServiceUnavailable
    from shared.inference import InferenceError

    wanted = tasks or list(DEFAULT_TASKS)
    check_tasks(wanted)  # a usage error before any server is asked
    progress = Progress(
        TextColumn("reasoning-gym"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=as_json or not err.is_terminal,
    )
    bar = progress.add_task("eval", total=len(dict.fromkeys(wanted)) * instances)
    try:
        with progress:
            result = asyncio.run(
                evaluate_suite(settings, wanted, instances, lambda _: progress.advance(bar))
            )
    except (ServiceUnavailable, InferenceError) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc
    _print_result(result, as_json, _suite_table)


def _suite_table(result: dict[str, Any]) -> Table:
    table = Table(
        title=f"reasoning-gym pass rate ({result['instances']} instances, seed {result['seed']})"
    )
    tasks = [key.removeprefix("pass_rate_") for key in result if key.startswith("pass_rate_")]
    whole_column(table, "task", tasks)
    for column in ("pass rate", "mean score", "format errors"):
        table.add_column(column)
    for key, value in result.items():
        if key.startswith("pass_rate_"):
            name = key.removeprefix("pass_rate_")
            table.add_row(
                name,
                f"{value:.2f}",
                f"{result[f'mean_score_{name}']:.2f}",
                f"{result[f'format_errors_{name}']}/{result[f'instances_{name}']}",
            )
    table.add_row(
        "all",
        f"{result['pass_rate']:.2f} [{result['ci_low']:.2f}, {result['ci_high']:.2f}]",
        f"{result['mean_score']:.2f}",
        f"{result['format_errors']}/{result['instances']}",
    )
    return table


def _require_workers(settings: Settings, app: object) -> None:
    """Exit with one line when no worker consumes a queue the evaluation's jobs need (they
    would wait forever)."""
    from evoenv_cli.cluster import redis_or_exit, unconsumed
    from evoenv_cli.envs import EXIT_ERROR, err
    from shared import keys

    redis_or_exit(settings).close()
    missing, message = unconsumed(app, [keys.GRADING_QUEUE, keys.GENERATION_QUEUE])
    if missing:
        err.print(f"error: {message}", markup=False)
        raise typer.Exit(EXIT_ERROR)
