"""The record a running `evoenv up` keeps in its run folder, and how other commands find it.

`evoenv up` starts a private Redis on a free port; without the record (`up.json`, see
`write_record`), `evoenv status` and the other commands that read Redis would read the
machine's default one: empty queues, a misleading all-zero view. See `choose_redis`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import redis

from shared.config import Settings, mask_url
from shared.errors import ServiceUnavailable
from shared.redis_client import ping

RECORD_NAME = "up.json"
PING_SECONDS = 2.0
"""How long a recorded Redis has to answer before the record counts as stale."""


@dataclass(frozen=True)
class UpRecord:
    """What `up.json` holds."""

    redis_url: str
    pid: int
    started_at: str
    """When that `up` started, ISO 8601 in UTC."""


@dataclass(frozen=True)
class RedisChoice:
    """The Redis a command reads, the line that says why, and a note on a stale record."""

    redis_url: str
    line: str
    note: str | None = None


def write_record(run_dir: Path, redis_url: str) -> Path:
    """Record this process as the running `up` of `run_dir`, readable by this user only (a
    Redis address may carry a password); replaced whole, never seen half-written. `up` writes
    it once its Redis answers and removes it (`remove_record`) when it stops."""
    path = run_dir / RECORD_NAME
    record = UpRecord(redis_url, os.getpid(), datetime.now(UTC).isoformat(timespec="seconds"))
    partial = path.with_suffix(".partial")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(asdict(record), f)
    partial.replace(path)
    return path


def remove_record(run_dir: Path) -> None:
    """Remove the record if it is this process's (another `up` may have replaced it since)."""
    try:
        record = read_record(run_dir)
    except ValueError:
        return
    if record is not None and record.pid == os.getpid():
        (run_dir / RECORD_NAME).unlink(missing_ok=True)


def read_record(run_dir: Path) -> UpRecord | None:
    """The record in `run_dir`; None when there is none; ValueError when it is unreadable."""
    try:
        data = json.loads((run_dir / RECORD_NAME).read_text("utf-8"))
        return UpRecord(str(data["redis_url"]), int(data["pid"]), str(data["started_at"]))
    except FileNotFoundError:
        return None
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"unreadable ({type(exc).__name__})") from exc


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redis_answers(url: str) -> bool:
    """Whether the Redis at `url` answers a ping within `PING_SECONDS`."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=PING_SECONDS, socket_timeout=PING_SECONDS
    )
    try:
        ping(client, url)
    except ServiceUnavailable:
        return False
    finally:
        client.close()
    return True


def live_record(
    run_dir: Path,
    alive: Callable[[int], bool] = pid_alive,
    answers: Callable[[str], bool] = redis_answers,
) -> tuple[UpRecord | None, str | None]:
    """The record of a running `up` in `run_dir` (None if there is none or it is stale), and
    a one-line note when a stale record was ignored."""
    path = run_dir / RECORD_NAME
    try:
        record = read_record(run_dir)
    except ValueError as exc:
        return None, f"note: ignoring {path}: {exc}"
    if record is None:
        return None, None
    if not alive(record.pid):
        why = f"pid {record.pid} is not running"
    elif not answers(record.redis_url):
        why = f"its Redis at {mask_url(record.redis_url)} does not answer"
    else:
        return record, None
    return None, f"note: ignoring {path}, a stale record of `evoenv up` ({why})"


def choose_redis(
    settings: Settings,
    alive: Callable[[int], bool] = pid_alive,
    answers: Callable[[str], bool] = redis_answers,
) -> RedisChoice:
    """The Redis a command should read: an explicit `EVOENV_REDIS_URL`, else that of the
    running `up` of the same run folder, else the default.

    A command finds the `up` of the same data folder and run by place: it looks in the run
    folder its own settings resolve to (`EVOENV_LEARNER__RUN_DIR`, or
    `EVOENV_DATA_DIR/runs/EVOENV_RUN`), which is where that `up` writes its checkpoints too. A
    record whose process is gone, or whose Redis does not answer (a `kill -9`, a crash), is
    stale: ignored, with a one-line note. The caller prints the choice's line on stderr (so
    that `--json` output stays parseable): which Redis it read and why.
    """
    record, note = live_record(settings.run_dir, alive, answers)
    of_up = f"the running `evoenv up` of {settings.run_dir}"
    if "redis_url" in settings.model_fields_set:
        why = "set by EVOENV_REDIS_URL"
        if record is not None and record.redis_url != settings.redis_url:
            why += f", which wins over {of_up} (pid {record.pid}, {mask_url(record.redis_url)})"
        return RedisChoice(settings.redis_url, _line(settings.redis_url, why), note)
    if record is not None:
        return RedisChoice(
            record.redis_url, _line(record.redis_url, f"{of_up}, pid {record.pid}"), note
        )
    why = f"the default: no running `evoenv up` of {settings.run_dir}"
    return RedisChoice(settings.redis_url, _line(settings.redis_url, why), note)


def _line(url: str, why: str) -> str:
    return f"redis: {mask_url(url)} ({why})"
