"""The record a running `evoenv up` keeps in its run folder (`up.json`): written when its Redis
answers, found by the commands run beside it, ignored with a note when stale (its process gone,
its Redis silent, the file unreadable), and overridden by an explicit EVOENV_REDIS_URL."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from evoenv_cli.up_record import (
    RECORD_NAME,
    choose_redis,
    read_record,
    remove_record,
    write_record,
)
from shared.config import Settings

UP_REDIS = "redis://127.0.0.1:40123/0"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings of a data folder, EVOENV_REDIS_URL not set."""
    monkeypatch.delenv("EVOENV_REDIS_URL", raising=False)
    monkeypatch.delenv("EVOENV_LEARNER__RUN_DIR", raising=False)
    settings = Settings(data_dir=tmp_path, run="default")
    settings.run_dir.mkdir(parents=True)
    return settings


def _alive(pid: int) -> bool:
    return True


def _dead(pid: int) -> bool:
    return False


def _answers(url: str) -> bool:
    return True


def _silent(url: str) -> bool:
    return False


def test_the_record_is_written_private_and_read_back(settings: Settings) -> None:
    path = write_record(settings.run_dir, UP_REDIS)
    assert path == settings.run_dir / RECORD_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(json.loads(path.read_text())) == {"redis_url", "pid", "started_at"}
    record = read_record(settings.run_dir)
    assert record is not None and record.redis_url == UP_REDIS and record.pid == os.getpid()


def test_a_live_record_is_found_and_said(settings: Settings) -> None:
    write_record(settings.run_dir, UP_REDIS)
    choice = choose_redis(settings, _alive, _answers)
    assert choice.redis_url == UP_REDIS and choice.note is None
    assert choice.line == (
        f"redis: {UP_REDIS} (the running `evoenv up` of {settings.run_dir}, pid {os.getpid()})"
    )


@pytest.mark.parametrize(
    ("alive", "answers", "why"),
    [(_dead, _answers, "is not running"), (_alive, _silent, "does not answer")],
    ids=["process-gone", "redis-silent"],
)
def test_a_stale_record_is_ignored_with_a_note(
    settings: Settings, alive: object, answers: object, why: str
) -> None:
    write_record(settings.run_dir, UP_REDIS)
    choice = choose_redis(settings, alive, answers)  # type: ignore[arg-type]
    assert choice.redis_url == settings.redis_url != UP_REDIS
    assert choice.note is not None and "stale" in choice.note and why in choice.note
    assert "\n" not in choice.note
    assert "the default: no running `evoenv up`" in choice.line


def test_an_unreadable_record_is_ignored_with_a_note(settings: Settings) -> None:
    (settings.run_dir / RECORD_NAME).write_text("{not json")
    choice = choose_redis(settings, _alive, _answers)
    assert choice.redis_url == settings.redis_url
    assert choice.note is not None and "unreadable" in choice.note


def test_no_record_reads_the_default_without_a_note(settings: Settings) -> None:
    choice = choose_redis(settings, _alive, _answers)
    assert choice.redis_url == settings.redis_url and choice.note is None


def test_an_explicit_setting_wins_and_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_record(settings.run_dir, UP_REDIS)
    mine = "redis://10.0.0.9:6379/0"
    monkeypatch.setenv("EVOENV_REDIS_URL", mine)
    explicit = Settings(data_dir=settings.data_dir, run="default")
    choice = choose_redis(explicit, _alive, _answers)
    assert choice.redis_url == mine
    assert choice.line.startswith(f"redis: {mine} (set by EVOENV_REDIS_URL, which wins over")
    assert UP_REDIS in choice.line


def test_another_run_does_not_find_the_record(settings: Settings) -> None:
    write_record(settings.run_dir, UP_REDIS)
    other = Settings(data_dir=settings.data_dir, run="other")
    assert choose_redis(other, _alive, _answers).redis_url == other.redis_url


def test_only_the_writer_removes_the_record(settings: Settings) -> None:
    path = write_record(settings.run_dir, UP_REDIS)
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "pid": os.getpid() + 1}))  # another `up`'s since
    remove_record(settings.run_dir)
    assert path.exists()
    write_record(settings.run_dir, UP_REDIS)
    remove_record(settings.run_dir)
    assert not path.exists()
