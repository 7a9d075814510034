"""`evoenv worker`, `evoenv flower`, `evoenv status`, `evoenv job` and the queue mode of
`evoenv validate`: the Celery side of the CLI."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from evoenv_cli.envs import (
    EXIT_ERROR,
    err,
    exit_code,
    out,
    print_report,
)
from evoenv_cli.terminal_text import plain
from shared import keys
from shared.config import Settings
from shared.errors import ServiceUnavailable, UsageError
from shared.messages import DeadLetter, ValidateJob, ValidationReport
from shared.ports import is_loopback


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("flower")(flower)
    app.command("status")(status)
    app.command("job")(job)


def _app(settings: Settings) -> Any:
    from evoenv_worker.app import configure

    return configure(settings)


def redis_or_exit(settings: Settings) -> Any:
    from shared.redis_client import connect

    try:
        return connect(settings, check=True)
    except ServiceUnavailable as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_ERROR) from exc


def redis_of_running_up(settings: Settings) -> Settings:
    """`settings` pointed at the Redis to read (`up_record.choose_redis`: an explicit
    EVOENV_REDIS_URL, else that of the running `evoenv up` of the same run folder, else the
    default), having said which and why on stderr."""
    from evoenv_cli.up_record import choose_redis

    choice = choose_redis(settings)
    if choice.note is not None:
        err.print(choice.note, markup=False)
    err.print(choice.line, markup=False)
    return settings.model_copy(update={"redis_url": choice.redis_url})


def worker(
    ctx: typer.Context,
    queues: str = typer.Option(
        ",".join(keys.QUEUES), "--queues", "-Q", help="Comma-separated queues to consume."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", "-c", help="Processes (threads for generation-only workers)."
    ),
    pool: str | None = typer.Option(
        None, "--pool", "-P", help="prefork or threads (default: threads for generation only)."
    ),
    name: str | None = typer.Option(None, "--name", "-n", help="Worker node name."),
) -> None:
    """Start a Celery worker on the given queues (runs until stopped)."""
    settings: Settings = ctx.obj
    wanted = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(wanted) - set(keys.QUEUES))
    if unknown or not wanted:
        raise UsageError(
            f"unknown queue(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(keys.QUEUES)}"
        )
    redis_or_exit(settings).close()
    _say_stream_key(settings)
    io_only = wanted == [keys.GENERATION_QUEUE]
    pool = pool or ("threads" if io_only else "prefork")
    if concurrency is None:
        concurrency = settings.worker.generation_threads if io_only else settings.worker.concurrency
    node = name or f"{'-'.join(wanted)}-{os.getpid()}@%h"
    app = _app(settings)
    from evoenv_worker import watchdog

    watchdog.start(settings)  # a stopping worker whose broker is gone ends within seconds
    app.worker_main(
        [
            "worker",
            "-Q",
            ",".join(wanted),
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-n",
            node,
            "-E",
            "--loglevel",
            settings.log_level,
            "--without-mingle",
        ]
    )


def _say_stream_key(settings: Settings) -> None:
    """Get the key the worker signs its stream entries with (a key that cannot be had stops it
    here, not at its first group) and name it: the learner's start line names its own."""
    from shared.stream_key import KEY_FILE, key_id, stream_key

    key = stream_key(settings)
    where = (
        "EVOENV_STREAM_KEY"
        if settings.stream_key.get_secret_value()
        else str(settings.data_dir / KEY_FILE)
    )
    err.print(f"stream key {key_id(key)} ({where})", markup=False)


def flower(ctx: typer.Context) -> None:
    """Start Flower on the queues (address, port and basic auth from EVOENV_FLOWER__*)."""
    settings: Settings = ctx.obj
    refuse_open_flower(settings)
    redis_or_exit(settings).close()
    app = _app(settings)
    argv = ["flower", f"--address={settings.flower.address}", f"--port={settings.flower.port}"]
    if settings.flower.basic_auth:
        argv.append(f"--basic-auth={settings.flower.basic_auth}")
    out.print(f"Flower on http://{settings.flower.address}:{settings.flower.port}", markup=False)
    app.start(argv=argv)


def refuse_open_flower(settings: Settings) -> None:
    """A `UsageError` where Flower would listen beyond loopback without basic auth (`evoenv
    flower`, and `evoenv up` before it starts anything)."""
    if not settings.flower.basic_auth and not is_loopback(settings.flower.address):
        raise UsageError(
            "Flower would face the network without a password: set EVOENV_FLOWER__BASIC_AUTH"
        )


def queue_depths(client: Any) -> dict[str, int]:
    return {queue: int(client.llen(queue)) for queue in keys.QUEUES}


def workers_on(app: Any, timeout: float = 1.5) -> dict[str, list[str]]:
    """Live workers and the queues each consumes."""
    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    return {node: sorted(q["name"] for q in queues) for node, queues in replies.items()}


def unconsumed(app: Any, queues: Sequence[str]) -> tuple[list[str], str]:
    """The queues of `queues` no live worker consumes, and one line saying how to fix it."""
    consumed = {queue for names in workers_on(app).values() for queue in names}
    missing = [queue for queue in queues if queue not in consumed]
    message = (
        f"no worker is consuming the {' and '.join(repr(q) for q in missing)} "
        f"queue{'s' if len(missing) > 1 else ''}; start one with "
        f"deploy/worker.sh --queues {','.join(missing)}"
    )
    return missing, message


def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Queue depths, workers alive, jobs in flight, dead letters, rollout stream, policy version."""
    settings = redis_of_running_up(ctx.obj)
    client = redis_or_exit(settings)
    app = _app(settings)
    inspect = app.control.inspect(timeout=1.5)
    active = inspect.active() or {}
    letters = [DeadLetter.model_validate_json(v) for v in client.hvals(keys.DEAD_LETTERS)]
    version = client.get(keys.POLICY_VERSION)
    report = {
        "redis": settings.masked()["redis_url"],
        "queues": queue_depths(client),
        "unacknowledged": int(client.hlen("unacked")),
        "workers": workers_on(app),
        "in_flight": {node: len(tasks) for node, tasks in active.items()},
        "dead_letters": [letter.model_dump(exclude={"payload"}) for letter in letters],
        "rollout_stream": int(client.xlen(keys.rollout_stream(settings.run))),
        "policy_version": int(version) if version is not None else None,
    }
    if as_json:
        out.print(json.dumps(report), markup=False)
        return
    table = Table(title=f"EvoEnv on {report['redis']} (run {settings.run})", show_header=False)
    for queue, depth in report["queues"].items():
        table.add_row(f"queue {queue}", str(depth))
    table.add_row("unacknowledged", str(report["unacknowledged"]))
    for node, queues in report["workers"].items():
        table.add_row(
            f"worker {node}", f"{', '.join(queues)}; {report['in_flight'].get(node, 0)} in flight"
        )
    if not report["workers"]:
        table.add_row("workers", "none alive")
    table.add_row("rollout stream", str(report["rollout_stream"]))
    table.add_row("policy version", str(report["policy_version"]))
    table.add_row("dead letters", str(len(letters)))
    out.print(table)
    for letter in letters:
        out.print(
            f"  dead: {letter.task} {letter.task_id} after {letter.attempts} deliveries: "
            f"{plain(letter.error)}",
            markup=False,
        )


def job(
    ctx: typer.Context,
    job_id: str = typer.Argument(
        ..., help="A job id printed by `evoenv validate --queue --no-wait`."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Show the state or result of a validation job."""
    settings = redis_of_running_up(ctx.obj)
    redis_or_exit(settings).close()
    app = _app(settings)
    result = app.AsyncResult(job_id)
    if result.state == "SUCCESS":
        report = ValidationReport.model_validate(result.result)
        out.print(json.dumps(report.public()), markup=False) if as_json else print_report(report)
        raise typer.Exit(exit_code([report]))
    if result.state == "FAILURE":
        err.print(f"job {plain(job_id)} failed: {plain(result.result)}", markup=False)
        raise typer.Exit(EXIT_ERROR)
    state = {"PENDING": "queued (or unknown id)"}.get(result.state, result.state.lower())
    out.print(f"job {job_id}: {state}", markup=False)


def validate_on_queue(
    settings: Settings,
    blobs: Sequence[tuple[Path, bytes]],
    as_json: bool,
    wait: bool,
    *,
    model_stages: bool = False,
    add_to_pool: bool = False,
) -> list[ValidationReport]:
    """`evoenv validate --queue`: one job per file on the validation queue (the model stages,
    if asked, then run as jobs on their own queues); the reports in the order they finish."""
    settings = redis_of_running_up(settings)
    client = redis_or_exit(settings)
    app = _app(settings)
    missing, message = unconsumed(app, [keys.VALIDATION_QUEUE])
    if missing:
        if wait:
            err.print(f"error: {message}", markup=False)
            raise typer.Exit(EXIT_ERROR)
        err.print(f"warning: {message}; the jobs wait in the queue", markup=False)
    from evoenv_worker.tasks import validate as validate_task

    pending: dict[str, Path] = {}
    for path, data in blobs:
        job_id = str(uuid.uuid4())
        payload = ValidateJob.for_file(
            job_id, str(path), data, model_stages=model_stages, add_to_pool=add_to_pool
        ).model_dump(mode="json")
        validate_task.apply_async(args=[payload], task_id=job_id)
        pending[job_id] = path
        if not wait:
            out.print(f"{job_id}  {plain(path)}", markup=False)
    if not wait:
        return []
    return _wait(app, client, settings, pending, as_json)


def _wait(
    app: Any, client: Any, settings: Settings, pending: dict[str, Path], as_json: bool
) -> list[ValidationReport]:
    reports: list[ValidationReport] = []
    results = {job_id: app.AsyncResult(job_id) for job_id in pending}
    last_check, lonely_since = time.monotonic(), None
    total = len(pending)
    while results:
        for job_id, result in list(results.items()):
            final = client.get(keys.final_report(job_id))
            if final is None and result.state != "FAILURE":
                continue
            del results[job_id]
            if final is not None:
                report = ValidationReport.model_validate_json(final)
            else:
                report = ValidationReport(
                    file=str(pending[job_id]),
                    name=None,
                    verdict="error",
                    failed_stage=None,
                    stages=[],
                    error=f"the job failed: {result.result}",
                )
            reports.append(report)
            out.print(json.dumps(report.public()), markup=False) if as_json else print_report(
                report
            )
        if not results:
            break
        if not as_json and err.is_terminal:
            err.file.write(f"\r\033[Kwaiting for {len(results)} of {total} validation job(s) ...")
            err.file.flush()
        if time.monotonic() - last_check > 10:
            last_check = time.monotonic()
            alive = any(keys.VALIDATION_QUEUE in q for q in workers_on(app).values())
            lonely_since = None if alive else (lonely_since or time.monotonic())
            if lonely_since and time.monotonic() - lonely_since > 30:
                err.print(
                    f"\nerror: no worker has consumed '{keys.VALIDATION_QUEUE}' for 30 s; "
                    f"{len(results)} job(s) still queued: {', '.join(results)}",
                    markup=False,
                )
                raise typer.Exit(EXIT_ERROR)
        time.sleep(0.2)
    if not as_json and err.is_terminal:
        err.file.write("\r\033[K")
    return reports
