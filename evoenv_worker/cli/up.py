"""`evoenv up`: the whole loop on one machine, supervised, with a live progress display.

Starts a private Redis (append-only, data in the run folder) unless EVOENV_REDIS_URL is set,
the vLLM server on the embedded model unless EVOENV_VLLM_URLS is set, one worker per queue,
Flower, and the learner in the foreground. Ctrl-C or --steps ends it cleanly: checkpoint,
every child stopped, the report written. Run it again in the same folder and it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from evoenv_worker.cli.envs import out
from shared import keys
from shared.config import Settings


def register(app: typer.Typer) -> None:
    app.command("up")(up)


def up(
    ctx: typer.Context,
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimiser steps."),
) -> None:
    """Run everything on this machine: Redis, vLLM, workers, Flower and the learner."""
    settings: Settings = ctx.obj
    if steps is not None:
        settings = settings.model_copy(
            update={"learner": settings.learner.model_copy(update={"steps": steps})}
        )
    state = asyncio.run(_up(settings))
    out.print(
        f"stopped at step {state['step']}, policy version {state['version']}; "
        f"report: {state['report']}",
        markup=False,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _evoenv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from evoenv_worker.cli import main; main()", *args]


async def _up(settings: Settings) -> dict[str, Any]:
    import httpx

    from evoenv_learner.loop import run
    from evoenv_learner.supervisor import Child, Supervisor

    run_dir = settings.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    env = dict(os.environ)
    supervisor = Supervisor()
    updates: dict[str, Any] = {}
    if "EVOENV_REDIS_URL" not in os.environ:
        redis_port = _free_port()
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
                ready=lambda: _listening(redis_port),
            )
        )
        updates["redis_url"] = f"redis://127.0.0.1:{redis_port}/0"
    if "EVOENV_VLLM_URLS" not in os.environ:
        vllm_port = settings.serve.port if not _listening(settings.serve.port) else _free_port()
        env["EVOENV_SERVE__PORT"] = str(vllm_port)
        url = f"http://127.0.0.1:{vllm_port}"

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
            return False

        supervisor.add(Child("vllm", _evoenv("serve"), env, logs / "vllm.log", ready=healthy))
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
    flower_port = settings.flower.port if not _listening(settings.flower.port) else _free_port()
    for child in supervisor.children:
        child.env = env
    workers = [
        Child(
            "worker-generation",
            _evoenv("worker", "-Q", keys.GENERATION_QUEUE),
            env,
            logs / "worker-generation.log",
        ),
        Child(
            "worker-validation",
            _evoenv("worker", "-Q", keys.VALIDATION_QUEUE, "-c", "1"),
            env,
            logs / "worker-validation.log",
        ),
        Child(
            "worker-grading",
            _evoenv("worker", "-Q", keys.GRADING_QUEUE, "-c", "1"),
            env,
            logs / "worker-grading.log",
        ),
        Child(
            "flower",
            _evoenv("flower"),
            {**env, "EVOENV_FLOWER__PORT": str(flower_port)},
            logs / "flower.log",
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
        out.print(f"Flower on http://127.0.0.1:{flower_port}  logs in {logs}", markup=False)
        resume = (run_dir / "checkpoints").is_dir() and any(
            (run_dir / "checkpoints").glob("step-*")
        )
        display = _Display()
        with Live(display.table(None, supervisor), refresh_per_second=1, transient=False) as live:

            def on_step(learner_state: Any) -> None:
                live.update(display.table(learner_state, supervisor))

            watcher = asyncio.create_task(supervisor.watch(stop))
            try:
                learner_state = await run(settings, resume=resume, on_step=on_step)
            finally:
                stop.set()
                await watcher
        state.update(step=learner_state.step, version=learner_state.version)
    finally:
        supervisor.stop_all()
    state["report"] = str(_report(settings))
    return state


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


class _Display:
    def table(self, learner: Any, supervisor: Any) -> Table:
        table = Table(title="EvoEnv", show_header=False)
        if learner is None:
            table.add_row("learner", "starting (model, first groups) ...")
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
        for child in supervisor.children:
            table.add_row(
                child.name,
                ("up" if child.alive else "down")
                + (f", {child.restarts} restarts" if child.restarts else ""),
            )
        return table


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"
