"""`evoenv up`: the whole loop on one machine, supervised, with a live progress display.

Starts a private Redis (append-only, data in the run folder) unless EVOENV_REDIS_URL is set,
the vLLM server on the embedded model unless EVOENV_VLLM_URLS is set, one worker per queue,
Flower, and the learner in the foreground. Ctrl-C or --steps ends it cleanly: checkpoint,
every child stopped, the report written; so does closing its terminal (SIGHUP), its output
going to /dev/null from then on. Run it again in the same folder and it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.live import Live
from rich.table import Table

from evoenv_worker.cli.envs import EXIT_ERROR, err, out
from shared import keys
from shared.config import Settings
from shared.errors import EvoEnvError
from shared.ports import free_port, listening


def register(app: typer.Typer) -> None:
    app.command("up")(up)


def up(
    ctx: typer.Context,
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimiser steps."),
) -> None:
    """Run everything on this machine: Redis, vLLM, workers, Flower and the learner."""
    settings: Settings = ctx.obj
    from evoenv_worker.serve import dtype_choice, on_gpu

    applied = apply_cpu_sizes()
    if applied:
        settings = Settings()
        out.print(
            "CPU only: smaller groups and completions ("
            + ", ".join(f"{k.removeprefix('EVOENV_').lower()}={v}" for k, v in applied.items())
            + "); set any of them to override",
            markup=False,
        )
    out.print(f"vLLM: {dtype_choice(settings, gpu=on_gpu())}", markup=False)
    if steps is not None:
        settings = settings.model_copy(
            update={"learner": settings.learner.model_copy(update={"steps": steps})}
        )
    from evoenv_learner.loop import hangup_handler

    hung_up = hangup_handler(_interrupt)
    if hung_up is not None:  # until the learner takes it over, a hangup is a Ctrl-C
        signal.signal(signal.SIGHUP, lambda *_: hung_up())
    try:
        state = asyncio.run(_up(settings))
    except EvoEnvError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc
    out.print(
        f"stopped at step {state['step']}, policy version {state['version']}; "
        f"report: {state['report']}",
        markup=False,
    )
    if state.get("gave_up"):
        err.print(
            f"error: {state['gave_up']} kept dying and was not restarted again; see "
            f"{settings.run_dir / 'logs' / (state['gave_up'] + '.log')}",
            markup=False,
        )
        raise typer.Exit(EXIT_ERROR)


VLLM_LAYER, WORKERS_LAYER = 1, 2
"""Stop order (`Child.layer`): the workers and Flower first, together; then vLLM, whose
requests they make; then Redis (layer 0, the default), which they all use."""
GENERATION_GRACE = 5.0
"""Seconds the generation worker has to stop: its jobs are model calls of up to minutes,
which a longer wait would not see through (it took the whole 20 s default at every Ctrl-C);
an unfinished job goes back to its queue, as for any killed worker."""


CPU_SIZES = {
    "EVOENV_GRPO__GROUP_SIZE": "4",
    "EVOENV_GRPO__BATCH_GROUPS": "2",
    "EVOENV_GRPO__MICRO_BATCH": "1",
    "EVOENV_GRPO__MAX_TOKENS": "384",
    "EVOENV_GRPO__GENERATOR_MAX_TOKENS": "1024",
    "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": "2",
    "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "2",
    "EVOENV_LEARNER__EVAL_INSTANCES": "8",
    "EVOENV_LEARNER__PROPOSAL_EXAMPLES": "1",
    "EVOENV_ADMISSION__CALIBRATION_DIFFICULTY": "1",
}
"""Sizes for a CPU-only machine (two cores train ~40 tokens/s on the default model): without
them one optimiser step of the reference sizes (4 groups of 8, completions up to 512 tokens,
generator files up to 1536) takes most of an hour. Calibration at the easiest level: at the
middle one the embedded solver passed 1 of 8 instances of one candidate and 0 of 8 of the
nine others that reached it in a half-hour run (nothing admitted). Two generator groups in
flight: with one, a new proposal waited for the last group's admission (2-2.5 minutes for a
group of 4 candidates), while vLLM's CPU decoding is bound by reading the weights, not by the
batch (on two cores the 0.5B model gives 9, 65 and 109 tokens/s at 1, 8 and 16 requests in
flight), so a second group costs little. Applied by `evoenv up`
where there is no GPU, each only when its variable is not set already (children inherit them)."""


def apply_cpu_sizes() -> dict[str, str]:
    """Set the CPU sizes in the environment where there is no GPU and the user has not set
    them; return those applied."""
    import torch

    if torch.cuda.is_available():
        return {}
    applied = {k: v for k, v in CPU_SIZES.items() if k not in os.environ}
    os.environ.update(applied)
    return applied


def core_split() -> tuple[frozenset[int], frozenset[int]] | None:
    """(vLLM's cores, the learner's cores) on a CPU-only machine with two cores or more.

    vLLM's CPU engine binds its OpenMP threads to cores and torch spreads the learner's over
    all of them; sharing a core slows both several times over (each parallel region waits for
    its slowest thread): measured on two cores, training fell from ~40 to ~8 tokens/s and a
    weight push from 5 to 60-75 s. Splitting the cores gives each its own."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available() or len(cores) < 2:
        return None
    half = len(cores) // 2
    return frozenset(cores[:half]), frozenset(cores[half:])


def _train_on(cores: frozenset[int]) -> None:
    import torch

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    out.print(f"learner on cores {sorted(cores)}", markup=False)


def _evoenv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from evoenv_worker.cli import main; main()", *args]


async def _up(settings: Settings) -> dict[str, Any]:
    import httpx

    from evoenv_learner.loop import run
    from evoenv_learner.supervisor import Child, Supervisor
    from shared.logging import add_log_file

    run_dir = settings.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    add_log_file(logs / "learner.log")
    env = dict(os.environ)
    supervisor = Supervisor()
    republish = asyncio.Event()
    every_core = frozenset(os.sched_getaffinity(0))
    split = core_split()
    own_env: dict[str, dict[str, str]] = {}
    updates: dict[str, Any] = {}
    if "EVOENV_REDIS_URL" not in os.environ:
        redis_port = free_port()
        (run_dir / "redis").mkdir(exist_ok=True)
        supervisor.add(
            Child(
                "redis",
                [
                    "redis-server",
                    "--port",
                    str(redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(run_dir / "redis"),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                ],
                env,
                logs / "redis.log",
                ready=lambda: listening(redis_port),
            )
        )
        updates["redis_url"] = f"redis://127.0.0.1:{redis_port}/0"
    if "EVOENV_VLLM_URLS" not in os.environ:
        vllm_port = settings.serve.port if not listening(settings.serve.port) else free_port()
        env["EVOENV_SERVE__PORT"] = str(vllm_port)
        url = f"http://127.0.0.1:{vllm_port}"

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
            return False

        if split is not None and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            own_env["vllm"] = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(split[0])))}
        supervisor.add(
            Child(
                "vllm",
                _evoenv("serve"),
                env,
                logs / "vllm.log",
                ready=healthy,
                restarted=republish.set,  # a restarted server serves the base weights
                layer=VLLM_LAYER,
            )
        )
        updates["vllm_urls"] = [url]
    settings = settings.model_copy(update=updates)
    env.update(
        {
            "EVOENV_REDIS_URL": settings.redis_url,
            "EVOENV_VLLM_URLS": ",".join(settings.vllm_urls),
            "EVOENV_DATA_DIR": str(settings.data_dir),
            "EVOENV_RUN": settings.run,
        }
    )
    flower_port = settings.flower.port if not listening(settings.flower.port) else free_port()
    for child in supervisor.children:
        child.env = {**env, **own_env.get(child.name, {})}
    workers = [
        Child(
            "worker-generation",
            _evoenv("worker", "-Q", keys.GENERATION_QUEUE),
            env,
            logs / "worker-generation.log",
            layer=WORKERS_LAYER,
            grace=GENERATION_GRACE,
        ),
        Child(
            "worker-validation",
            _evoenv("worker", "-Q", keys.VALIDATION_QUEUE, "-c", "1"),
            env,
            logs / "worker-validation.log",
            layer=WORKERS_LAYER,
        ),
        Child(
            "worker-grading",
            _evoenv("worker", "-Q", keys.GRADING_QUEUE, "-c", "1"),
            env,
            logs / "worker-grading.log",
            layer=WORKERS_LAYER,
        ),
        Child(
            "flower",
            _evoenv("flower"),
            {**env, "EVOENV_FLOWER__PORT": str(flower_port)},
            logs / "flower.log",
            layer=WORKERS_LAYER,
        ),
    ]
    (run_dir / "settings.json").write_text(json.dumps(settings.masked(), indent=2, default=str))
    stop = asyncio.Event()
    state: dict[str, Any] = {"step": 0, "version": 0, "report": None}
    try:
        for child in supervisor.children:
            out.print(f"starting {child.name} ...", markup=False)
            await supervisor.start(child, timeout=900 if child.name == "vllm" else 60)
        for child in workers:
            supervisor.add(child)
            child.start()
        for child in supervisor.children:
            child.cpus = every_core  # restarts must not inherit the learner's cores
        if split is not None:
            _train_on(split[1])
        out.print(f"Flower on http://127.0.0.1:{flower_port}  logs in {logs}", markup=False)
        resume = (run_dir / "checkpoints").is_dir() and any(
            (run_dir / "checkpoints").glob("step-*")
        )
        display = Display(supervisor, settings.grpo.batch_groups)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # loading bars would break the live display
        # drawn anew at each refresh: the children's state and the wait for the first step
        # show as they change, not only at the next step
        with Live(get_renderable=display.table, refresh_per_second=1, transient=False) as live:

            def on_start(learner_state: Any) -> None:
                display.learner = learner_state

            def on_step(learner_state: Any) -> None:
                display.learner = learner_state
                live.refresh()
                if not out.is_terminal:  # Live shows only its last table off a terminal
                    out.print(display.line(learner_state), markup=False)

            async def watch() -> None:
                await supervisor.watch(stop)
                if supervisor.gave_up:  # stop the learner cleanly (checkpoint), as Ctrl-C does
                    os.kill(os.getpid(), signal.SIGTERM)

            watcher = asyncio.create_task(watch())
            try:
                learner_state = await run(
                    settings,
                    resume=resume,
                    on_step=on_step,
                    on_start=on_start,
                    republish=republish,
                )
            finally:
                stop.set()
                await watcher
        state.update(step=learner_state.step, version=learner_state.version)
        state["gave_up"] = supervisor.gave_up
    finally:
        supervisor.stop_all()
    state["report"] = str(_report(settings))
    return state


def _interrupt() -> NoReturn:
    raise KeyboardInterrupt


def _report(settings: Settings) -> Path:
    try:
        from evoenv_learner.report import write_report
        from shared.db import Archive
    except ImportError:
        return settings.run_dir
    write_report(
        Archive(settings.archive_url),
        settings.run,
        settings.run_dir / "report",
        run_dir=settings.run_dir,
    )
    return settings.run_dir / "report" / "report.md"


class Display:
    """The live table: the learner's state (once it runs) and the children's."""

    def __init__(self, supervisor: Any, batch_groups: int) -> None:
        self.supervisor = supervisor
        self.batch_groups = batch_groups
        self.learner: Any = None

    def table(self) -> Table:
        learner, supervisor = self.learner, self.supervisor
        table = Table(title="EvoEnv", show_header=False)
        if learner is None:
            table.add_row("learner", "starting (model, checkpoint) ...")
        elif learner.step == 0 and not learner.last_metrics and not learner.stopping:
            # on two cores the first step can take many minutes: groups whose answers all
            # score alike teach nothing and are skipped
            table.add_row(
                "learner",
                f"first step: waiting for {self.batch_groups} groups with different rewards "
                f"({learner.skipped_groups} skipped: all answers scored alike)",
            )
        else:
            m = learner.last_metrics
            table.add_row("step / policy version", f"{learner.step} / {learner.version}")
            table.add_row("solver reward", _fmt(m.get("reward_mean_solver")))
            table.add_row("generator reward", _fmt(m.get("reward_mean_generator")))
            table.add_row("pool size", str(m.get("pool", "-")))
            table.add_row(
                "admission funnel",
                ", ".join(f"{k}: {v}" for k, v in sorted(learner.funnel.items())) or "-",
            )
            table.add_row(
                "in flight (solver / generator)",
                f"{m.get('in_flight_solver', '-')} / {m.get('in_flight_generator', '-')}",
            )
            table.add_row("stale groups dropped", str(learner.stale_dropped))
            if learner.stopping:
                table.add_row("stopping", "the step in progress is dropped; writing a checkpoint")
        for child in supervisor.children:
            table.add_row(
                child.name,
                ("up" if child.alive else "down")
                + (f", {child.restarts} restarts" if child.restarts else ""),
            )
        return table

    def line(self, learner: Any) -> str:
        """The table's learner rows on one line, for output that is not a terminal."""
        m = learner.last_metrics
        funnel = ", ".join(f"{k}: {v}" for k, v in sorted(learner.funnel.items())) or "-"
        return (
            f"step {learner.step}  version {learner.version}  solver reward "
            f"{_fmt(m.get('reward_mean_solver'))}  generator reward "
            f"{_fmt(m.get('reward_mean_generator'))}  pool {m.get('pool', '-')}  "
            f"admission funnel {funnel}"
            + (
                "  (stopping: dropping the step in progress, then a checkpoint)"
                if learner.stopping
                else ""
            )
        )


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"
