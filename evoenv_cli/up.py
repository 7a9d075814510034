"""`evoenv up`: the whole loop on one machine, supervised, with a live display (`up_display`).

Redis and vLLM (each unless its address is set), the workers, Flower and the learner run as
children under `supervisor.Supervisor` (restarted if they die; none outlives `up`); Ctrl-C,
--steps or a hangup end it cleanly, and it resumes when run again (docs/DESIGN.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog
import typer
from rich.live import Live

from evoenv_cli import tree_memory
from evoenv_cli.envs import EXIT_ERROR, err, out
from evoenv_cli.learner_state import read_state, state_path
from evoenv_cli.responsive import replace_silent
from evoenv_cli.supervisor import Child, Supervisor, command_pid, descendants, process_parents
from evoenv_cli.up_display import Display, progress_lines
from evoenv_cli.up_record import remove_record, write_record
from shared import keys
from shared.config import Settings
from shared.errors import EvoEnvError, UsageError
from shared.ports import free_port, is_loopback, listening
from shared.secret_file import secret_in

log = structlog.get_logger(__name__)


def register(app: typer.Typer) -> None:
    app.command("up")(up)


def up(
    ctx: typer.Context,
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimiser steps."),
) -> None:
    """Run everything on this machine: Redis, vLLM, workers, Flower and the learner."""
    started = time.monotonic()
    settings: Settings = ctx.obj
    from evoenv_model.serve import dtype_choice, on_gpu

    refuse_open_doors(settings)

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
    try:
        state = asyncio.run(_up(settings, started, steps))
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
            f"error: {state['gave_up']} {state['gave_up_reason']} too often and was not "
            f"restarted again; see {settings.run_dir / 'logs' / (state['gave_up'] + '.log')}",
            markup=False,
        )
        raise typer.Exit(EXIT_ERROR)


VLLM_LAYER, WORKERS_LAYER = 1, 2
"""Stop order (`Child.layer`): the learner, the workers and Flower first, together; then
vLLM, whose requests they make; then Redis (layer 0, the default), which they all use."""
LEARNER_GRACE = 45.0
"""Seconds the learner has to stop (drop its step, write a checkpoint of the weights and AdamW's
moments, acknowledge its groups) before it is killed: within Ctrl-C's minute, with the rest."""
LEARNER_RESTARTS = 3
"""Times a learner that died is restarted from its last checkpoint before `up` gives up."""
GENERATION_GRACE = 5.0
"""Seconds the generation worker has to stop: its jobs are model calls of up to minutes,
which a longer wait would not see through (it took the whole 20 s default at every Ctrl-C);
an unfinished job goes back to its queue, as for any killed worker."""


CPU_SIZES = {
    "EVOENV_GRPO__GROUP_SIZE": "4",
    "EVOENV_GRPO__BATCH_GROUPS": "1",
    "EVOENV_GRPO__MICRO_BATCH": "1",
    "EVOENV_GRPO__MAX_TOKENS": "384",
    "EVOENV_GRPO__GENERATOR_MAX_TOKENS": "1024",
    "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": "2",
    "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "2",
    "EVOENV_LEARNER__EVAL_INSTANCES": "8",
    "EVOENV_LEARNER__PROPOSAL_EXAMPLES": "1",
    "EVOENV_ADMISSION__CALIBRATION_DIFFICULTY": "1",
    # A proposal of four 1,024-token files outlived the 600 s completion limit on two AVX2
    # cores (killed and sent again from scratch, so no generator group ever arrived).
    "EVOENV_WORKER__COMPLETE_TIME_LIMIT": "1800",
    "EVOENV_WORKER__VISIBILITY_TIMEOUT": "2400",
}
"""Sizes for a CPU-only machine (two cores train ~40 tokens/s on the default model): without
them one optimiser step of the reference sizes (4 groups of 8, completions up to 512 tokens,
generator files up to 1536) takes most of an hour. One group a step: most groups of the
untrained model score alike and are skipped, so a step that waits for two comes half as often
(AMD EPYC with AVX512-BF16, 30 minutes from a fresh data folder: 14 steps with one, 4 with two;
docs/results.md). Calibration at the easiest level: at the
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
    weight push from 5 to 60-75 s. Splitting the cores gives each its own; taking turns
    (`learner.take_turns`, the default here) gives each all of them in turn instead."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    if torch.cuda.is_available() or len(cores) < 2:
        return None
    half = len(cores) // 2
    return frozenset(cores[:half]), frozenset(cores[half:])


def refuse_open_doors(settings: Settings) -> None:
    """A `UsageError`, before anything starts, where a server `up` would start listens beyond
    loopback without credentials that only the user can give: the vLLM server without
    `serve.api_key`, Flower without basic auth. (Its Redis gets a password: `redis_password`.)"""
    from evoenv_cli.cluster import refuse_open_flower
    from evoenv_model.serve import refuse_open_door

    if "EVOENV_VLLM_URLS" not in os.environ:
        refuse_open_door(settings)
    refuse_open_flower(settings)


REDIS_PASSWORD_FILE = "redis-password"
"""The file under DATA_DIR where `up` keeps the password it generated for its Redis."""


def redis_password(settings: Settings) -> tuple[str, Path | None]:
    """The password of the Redis `up` starts, and the file it is in when `up` generated it:
    `redis_password` when set; else, where `redis_bind` is not loopback, the one in
    DATA_DIR/redis-password (generated there, readable by this user only, the first time, and
    kept for the next runs, so that other hosts' settings stay valid); else none."""
    given = settings.redis_password.get_secret_value()
    if given or is_loopback(settings.redis_bind):
        return given, None
    path = settings.data_dir / REDIS_PASSWORD_FILE
    password = secret_in(path)
    if not password:
        raise UsageError(f"{path} is empty: remove it (a new password is made) or fill it")
    return password, path


def _evoenv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from evoenv_cli import main; main()", *args]


def _say(line: str) -> None:
    out.print(line, markup=False)


async def _up(settings: Settings, started: float, steps: int | None) -> dict[str, Any]:
    """Start the children, then watch them until a stop; `started` is the `time.monotonic()` of
    the command's start, from which the progress lines count."""
    supervisor = Supervisor(on_event=_say)
    display = Display(supervisor, settings.grpo.batch_groups, started)
    # off a terminal, a line a minute until the first step (the live table shows the same)
    ticker = None if out.is_terminal else asyncio.create_task(progress_lines(display, _say))
    try:
        return await _run_up(settings, supervisor, display, steps)
    finally:
        if ticker is not None:
            ticker.cancel()


async def _run_up(
    settings: Settings, supervisor: Supervisor, display: Display, steps: int | None
) -> dict[str, Any]:
    """Add the children and start them under `supervisor`, the learner last; watch them until a
    stop (Ctrl-C, SIGTERM, a hangup; the learner done with its steps; a child that kept dying),
    then stop every child and write the report, whatever happened; the final step, version and
    report path."""
    from shared.logging import add_log_file
    from shared.stream_key import stream_key

    run_dir = settings.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    add_log_file(logs / "up.log")
    env = dict(os.environ)
    # one key for the children to sign and check the stream's entries with, DATA_DIR/stream.key
    # written if unset and missing (`shared/stream_key.py`)
    env["EVOENV_STREAM_KEY"] = stream_key(settings).decode()
    every_core = frozenset(os.sched_getaffinity(0))
    # Taking turns (the default without a GPU), vLLM and the learner each use every core in
    # turn; otherwise each keeps its own half.
    split = core_split() if settings.learner.take_turns is False else None
    settings = _add_services(settings, supervisor, env, logs, split)
    flower_port = settings.flower.port if not listening(settings.flower.port) else free_port()
    workers = _workers(env, logs, flower_port, settings.redis_url)
    learner = _learner(settings, env, logs, steps, split)
    for child in supervisor.children:
        if child.name == "vllm":  # a restarted server serves the base weights
            child.restarted = functools.partial(_republish, learner, run_dir)
    (run_dir / "settings.json").write_text(json.dumps(settings.masked(), indent=2, default=str))
    state_file = state_path(run_dir)
    state_file.unlink(missing_ok=True)  # the learner writes it anew once it runs
    stop = asyncio.Event()
    watchers = _stop_on_signals(stop)
    state: dict[str, Any] = {"step": 0, "version": 0, "report": None}
    try:
        # drawn anew at each refresh: the children's state, the progress counts and the wait
        # for the first step show as they change, not only at the next step
        with Live(get_renderable=display.table, refresh_per_second=1, transient=False) as live:
            await _until(stop, _start_services(supervisor, display, run_dir, settings.redis_url))
            if not stop.is_set():
                _start_workers(supervisor, workers, every_core)
                supervisor.add(learner)
                learner.start()
                out.print(f"Flower on http://127.0.0.1:{flower_port}  logs in {logs}", markup=False)
                follow = asyncio.create_task(_follow(display, state_file, live))
                sampler = asyncio.create_task(_sample_memory(supervisor, logs))
                visibility = settings.worker.visibility_timeout
                sweeper = asyncio.create_task(_sweep_unacknowledged(settings.redis_url, visibility))
                pinger = _ping_workers(supervisor, settings)
                try:
                    await supervisor.watch(stop)
                finally:
                    follow.cancel()
                    sampler.cancel()
                    sweeper.cancel()
                    if pinger is not None:
                        pinger.cancel()
                    _show(display, state_file, live)  # a step of the last second
            if display.learner is not None:
                display.learner = replace(display.learner, stopping=True)
                live.refresh()
    finally:
        for watcher in watchers:
            watcher.cancel()
        try:
            _stop_children(supervisor, run_dir)
        finally:
            state["report"] = str(_report(settings))
    final = read_state(state_file)
    if final is not None:
        state.update(step=final.step, version=final.version)
    state["gave_up"] = supervisor.gave_up
    state["gave_up_reason"] = supervisor.gave_up_reason
    return state


async def _until(stop: asyncio.Event, work: Coroutine[Any, Any, None]) -> None:
    """Run `work` unless `stop` is set first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.done() and not task.cancelled():
        task.result()  # its error, as itself


def _stop_on_signals(stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP (unless ignored, as under `nohup`) set `stop`; so
    does a terminal that goes away without a SIGHUP. The tasks that watch the terminal."""
    from evoenv_learner.loop import hangup_handler, watch_terminal

    def request_stop() -> None:
        if not stop.is_set():
            _say("stopping: the learner writes a checkpoint, then every process stops")
        stop.set()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, request_stop)
    loop.add_signal_handler(signal.SIGTERM, request_stop)
    hung_up = hangup_handler(stop.set)
    if hung_up is None:
        return []
    loop.add_signal_handler(signal.SIGHUP, hung_up)
    return [asyncio.create_task(watch_terminal(hung_up))]


def _add_services(
    settings: Settings,
    supervisor: Supervisor,
    env: dict[str, str],
    logs: Path,
    split: tuple[frozenset[int], frozenset[int]] | None,
) -> Settings:
    """Add Redis and the vLLM server to `supervisor`, each unless its address is set; `settings`
    pointed at them, and `env`, the children's environment, updated to match (vLLM bound to
    its half of the cores when `split`)."""
    own_env: dict[str, dict[str, str]] = {}
    updates: dict[str, Any] = {}
    if "EVOENV_REDIS_URL" not in os.environ:
        updates["redis_url"] = _add_redis(settings, supervisor, env, logs)
    if "EVOENV_VLLM_URLS" not in os.environ:
        updates["vllm_urls"] = [_add_vllm(settings, supervisor, env, logs)]
        if split is not None and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            own_env["vllm"] = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(split[0])))}
    settings = settings.model_copy(update=updates)
    env.update(
        {
            "EVOENV_REDIS_URL": settings.redis_url,
            "EVOENV_VLLM_URLS": ",".join(settings.vllm_urls),
            "EVOENV_DATA_DIR": str(settings.data_dir),
            "EVOENV_RUN": settings.run,
        }
    )
    for child in supervisor.children:
        child.env = {**env, **own_env.get(child.name, {})}
    return settings


def _add_redis(settings: Settings, supervisor: Supervisor, env: dict[str, str], logs: Path) -> str:
    """Add a private Redis on a free port (`redis_child`) to `supervisor`; its URL."""
    child, url = redis_child(settings, env, logs)
    supervisor.add(child)
    return url


def redis_child(settings: Settings, env: dict[str, str], logs: Path) -> tuple[Child, str]:
    """A private Redis on a free port, append-only, its data in RUN/redis, and its URL (for
    the children: on 127.0.0.1). Every write reaches the disk before it is answered
    (`appendfsync always`): a Redis killed outright loses no acknowledged job or group, for
    about 0.4 ms a write (docs/DESIGN.md). It listens on `redis_bind` (and 127.0.0.1), with
    `redis_password`'s password, if any, in a configuration file of this user's only (a
    command line is anyone's to read); the URL carries it."""
    redis_port = free_port()
    folder = settings.run_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    bind = settings.redis_bind
    addresses = ["127.0.0.1"] if is_loopback(bind) else ["127.0.0.1", bind]
    if bind == "0.0.0.0":  # every IPv4 address, 127.0.0.1 among them
        addresses = [bind]
    password, generated = redis_password(settings)
    config: list[str] = []
    if password:
        conf = folder / "auth.conf"
        conf.unlink(missing_ok=True)
        with os.fdopen(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            quoted = password.replace("\\", "\\\\").replace('"', '\\"')
            f.write(f'requirepass "{quoted}"\n')
        config = [str(conf)]
    if generated is not None:
        _say(
            f"Redis listens on {bind}:{redis_port} with the password in {generated} (other "
            f"hosts: EVOENV_REDIS_URL=redis://:PASSWORD@THIS-HOST:{redis_port}/0)"
        )
    argv = [
        "redis-server", *config,
        "--port", str(redis_port),
        "--bind", *addresses,
        "--dir", str(folder),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
    ]  # fmt: skip
    child = Child("redis", argv, env, logs / "redis.log", ready=lambda: listening(redis_port))
    auth = f":{quote(password, safe='')}@" if password else ""
    return child, f"redis://{auth}127.0.0.1:{redis_port}/0"


def _add_vllm(settings: Settings, supervisor: Supervisor, env: dict[str, str], logs: Path) -> str:
    """Add the vLLM server on its configured port (a free one if that is taken), ready once
    it answers /health; its URL."""
    import httpx

    vllm_port = settings.serve.port if not listening(settings.serve.port) else free_port()
    env["EVOENV_SERVE__PORT"] = str(vllm_port)
    url = f"http://127.0.0.1:{vllm_port}"

    def healthy() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
        return False

    supervisor.add(
        Child(
            "vllm",
            _evoenv("serve"),
            env,
            logs / "vllm.log",
            ready=healthy,
            layer=VLLM_LAYER,
        )
    )
    return url


def _workers(env: dict[str, str], logs: Path, flower_port: int, redis_url: str) -> list[Child]:
    """One worker per queue, and Flower on `flower_port`: the layer that stops first. A worker
    that dies has its queue's jobs in hand given back at once (`_worker_died`)."""
    return [
        Child(
            "worker-generation",
            _evoenv("worker", "-Q", keys.GENERATION_QUEUE),
            env,
            logs / "worker-generation.log",
            layer=WORKERS_LAYER,
            grace=GENERATION_GRACE,
            died=functools.partial(_worker_died, redis_url, keys.GENERATION_QUEUE),
        ),
        Child(
            "worker-validation",
            _evoenv("worker", "-Q", keys.VALIDATION_QUEUE, "-c", "1"),
            env,
            logs / "worker-validation.log",
            layer=WORKERS_LAYER,
            died=functools.partial(_worker_died, redis_url, keys.VALIDATION_QUEUE),
        ),
        Child(
            "worker-grading",
            _evoenv("worker", "-Q", keys.GRADING_QUEUE, "-c", "1"),
            env,
            logs / "worker-grading.log",
            layer=WORKERS_LAYER,
            died=functools.partial(_worker_died, redis_url, keys.GRADING_QUEUE),
        ),
        Child(
            "flower",
            _evoenv("flower"),
            {**env, "EVOENV_FLOWER__PORT": str(flower_port)},
            logs / "flower.log",
            layer=WORKERS_LAYER,
        ),
    ]


async def _start_services(
    supervisor: Supervisor, display: Display, run_dir: Path, redis_url: str
) -> None:
    """Start the children added so far (Redis, vLLM), each waited for until it serves, and
    record the Redis in the run folder as soon as it answers, for `evoenv status` and the other
    commands run beside this one (`up_record`), not only after vLLM's minutes of loading."""
    if not any(child.name == "redis" for child in supervisor.children):
        write_record(run_dir, redis_url)  # the user's own Redis, already there
    for child in supervisor.children:
        out.print(f"starting {child.name} ...", markup=False)
        display.starting = child.name
        await supervisor.start(child, timeout=900 if child.name == "vllm" else 60)
        display.starting = None
        if child.name == "redis":
            write_record(run_dir, redis_url)


def _start_workers(
    supervisor: Supervisor, workers: list[Child], every_core: frozenset[int]
) -> None:
    """Add the workers and Flower and start them (nothing waits for them); every child is
    then restarted on every core, not on the learner's."""
    for child in workers:
        supervisor.add(child)
        child.start()
    for child in supervisor.children:
        child.cpus = every_core  # restarts must not inherit the learner's cores


def _learner(
    settings: Settings,
    env: dict[str, str],
    logs: Path,
    steps: int | None,
    split: tuple[frozenset[int], frozenset[int]] | None,
) -> Child:
    """The learner as a child (`evoenv learner --resume`: from the run's last checkpoint, if
    any): restarted from its last checkpoint if it dies, at most `LEARNER_RESTARTS` times;
    its exit 0 (its --steps done) ends the run. Its JSON log in RUN/logs/learner.log; on its
    half of the cores when `split`."""
    own = {
        **env,
        "EVOENV_LOG_FORMAT": env.get("EVOENV_LOG_FORMAT", "json"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # loading bars: one endless line in a log file
    }
    if split is not None:
        own["OMP_NUM_THREADS"] = str(len(split[1]))
    return Child(
        "learner",
        learner_argv(settings.learner.ranks, steps),
        own,
        logs / "learner.log",
        cpus=split[1] if split is not None else None,
        layer=WORKERS_LAYER,
        grace=LEARNER_GRACE,
        max_restarts=LEARNER_RESTARTS,
        finishes=True,
        died=functools.partial(_learner_died, settings),
    )


def learner_argv(ranks: int, steps: int | None) -> list[str]:
    """`evoenv learner --resume`, through torchrun on `ranks` processes when more than one
    (sharded: `evoenv_learner/distributed.py`)."""
    args = ["-v", "learner", "--resume", *(["--steps", str(steps)] if steps else [])]
    if ranks == 1:
        return _evoenv(*args)
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    return [sys.executable, *launcher, "-m", "evoenv_cli", *args]


def _worker_died(redis_url: str, queue: str, reason: str) -> None:
    """A worker killed outright leaves the jobs it held unacknowledged, handed out again only
    after the visibility timeout (minutes), while the run waits for them: it is the only
    consumer of `queue` in `up`, so they are put back at once for its restart. One that
    stopped itself gave them back already; with Redis unreachable they wait for the timeout."""

    from evoenv_worker.broker import restore_unacknowledged

    try:
        restored = restore_unacknowledged(redis_url, [queue])
    except Exception as exc:  # noqa: BLE001 (Redis away: kombu's or redis's errors)
        log.warning("worker_jobs_not_restored", queue=queue, reason=reason, error=str(exc))
        return
    log.info("worker_died", queue=queue, reason=reason, jobs_restored=restored)


def _learner_died(settings: Settings, reason: str) -> None:
    """A learner that died in a step taken in turns left the model servers paused: resume
    them (and close the pause's record), so generation goes on until its restart."""
    import httpx
    import redis

    from shared import pauses
    from shared.inference import bearer

    headers = bearer(settings.serve.api_key.get_secret_value())
    for url in settings.vllm_urls:
        try:
            httpx.post(f"{url.rstrip('/')}/resume", timeout=10.0, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("resume_after_learner_failed", server=url, error=str(exc))
    with contextlib.suppress(redis.RedisError):
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=5.0)
        pauses.ended(client)
        client.close()
    log.info("learner_died", reason=reason, then="servers resumed")


def _republish(learner: Child, run_dir: Path) -> None:
    """Ask the running learner to push its weights again (SIGUSR1), once it runs: one that is
    still loading pushes its checkpoint's weights anyway when it is ready."""
    view = read_state(state_path(run_dir))
    if learner.proc is None or view is None:
        return
    if process_parents().get(view.pid) == learner.proc.pid:  # this learner, past its start
        learner.send_signal(signal.SIGUSR1)


async def _follow(display: Display, path: Path, live: Live) -> None:
    """Show the learner's state from its file, read once a second (`_show`)."""
    while True:
        _show(display, path, live)
        await asyncio.sleep(1.0)


def _show(display: Display, path: Path, live: Live) -> None:
    """Show the learner's state from its file; off a terminal, one line for each step (and one
    when it begins to stop). Called once more when `up` is asked to stop, so a step taken in
    the last second before it has its line too."""
    view = read_state(path)
    if view is None:
        return
    if display.learner is None:
        display.learner_started(view)
    display.learner = view
    if (view.step, view.stopping) != display.shown and (view.last_metrics or view.stopping):
        display.shown = (view.step, view.stopping)
        if not out.is_terminal:  # Live shows only its last table off a terminal
            out.print(display.line(view), markup=False)
    live.refresh()


def _ping_workers(supervisor: Supervisor, settings: Settings) -> asyncio.Task[None] | None:
    """The task that replaces a worker that stops answering (`responsive.replace_silent`)."""
    after = settings.worker.unresponsive_after
    if after <= 0:
        return None
    workers = [c for c in supervisor.children if c.name.startswith("worker-")]
    return asyncio.create_task(
        replace_silent(workers, settings.redis_url, after, command_pid, supervisor.say)
    )


SWEEP_SECONDS = 30.0
"""How often `up` hands back the jobs taken longer ago than the visibility timeout."""


async def _sweep_unacknowledged(redis_url: str, visibility: float) -> None:
    """Every `SWEEP_SECONDS`, the jobs taken more than `visibility` seconds ago and still not
    acknowledged go back to their queue (`restore_unacknowledged`): kombu's own rule, which
    each worker applies in a loop that a Redis restart can break (a job retried while Redis
    was down then waited for ever: docs/DESIGN.md, "Delivery is at least once")."""

    from evoenv_worker.broker import restore_unacknowledged

    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            restored = await asyncio.to_thread(
                restore_unacknowledged, redis_url, None, older_than=visibility
            )
        except Exception as exc:  # noqa: BLE001 (Redis away: kombu's or redis's errors; next time)
            log.debug("sweep_skipped", error=str(exc))
            continue
        if restored:
            log.info("jobs_swept_back", jobs=restored, older_than_s=visibility)


async def _sample_memory(supervisor: Supervisor, logs: Path) -> None:
    """Every `tree_memory.EVERY` seconds, the memory of `up` and of each child with its
    descendants, appended to RUN/logs/memory.jsonl and logged."""
    path = logs / tree_memory.MEMORY_LOG
    while True:
        parents = process_parents()
        groups = {"up": {os.getpid()}}
        for child in supervisor.children:
            if child.alive:
                groups[child.name] = {child.proc.pid} | descendants(  # type: ignore[union-attr]
                    child.proc.pid,  # type: ignore[union-attr]
                    parents=parents,
                )
        record = await asyncio.to_thread(tree_memory.sample, groups)
        await asyncio.to_thread(tree_memory.append, path, record)
        log.info("memory", pss_gib=record["pss_gib"], rss_gib=record["rss_gib"])
        await asyncio.sleep(tree_memory.EVERY)


def _stop_children(supervisor: Supervisor, run_dir: Path) -> None:
    """Stop every child, layer by layer (the workers and Flower together, then vLLM, then
    Redis), then remove this `up`'s record from the run folder, even if a stop failed."""
    try:
        supervisor.stop_all()
    finally:
        remove_record(run_dir)


def _report(settings: Settings) -> Path:
    try:
        from evoenv_cli.run_report import write_report
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
