"""Signing the rollout stream's entries: an entry verifies only as a worker holding the key wrote
it, on its own stream; each role's rewards have their range; the key is the setting, else one
file in the data folder that every process there shares."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError
from support import graded_group

from shared.config import AdmissionSettings, Settings
from shared.errors import UsageError
from shared.messages import GradedGroup
from shared.rewards import generator_bounds, generator_reward
from shared.rollouts import EntryCheck, sign
from shared.stream_key import KEY_FILE, key_id, stream_key

KEY = "a" * 64
CHECK = EntryCheck.of(Settings(stream_key=KEY))
STREAM = "evoenv:r:rollouts"


def group(role: str = "solver", rewards: tuple[float | None, ...] = (1.0, 0.0)) -> GradedGroup:
    return graded_group(role, rewards)


def signed(entry: GradedGroup, key: bytes = CHECK.key) -> dict[bytes, bytes]:
    raw = entry.model_dump_json().encode()
    return {b"group": raw, b"sig": sign(key, STREAM, raw).encode(), b"key_id": key_id(key).encode()}


def test_an_entry_verifies_only_whole_as_signed_with_the_key_on_its_stream() -> None:
    fields = signed(group())
    assert CHECK.forged(STREAM, fields) is None
    assert CHECK.forged(STREAM, {b"group": fields[b"group"]}) == "no signature"
    assert CHECK.forged(STREAM, {}) == "no signature"
    assert "signed with another key" in str(CHECK.forged(STREAM, signed(group(), b"b" * 64)))
    for old, new in ((b'"reward":0.0', b'"reward":1.0'), (b'"group_id":"g1"', b'"group_id":"g2"')):
        altered = {**fields, b"group": fields[b"group"].replace(old, new)}
        assert altered != fields
        assert "altered" in str(CHECK.forged(STREAM, altered))
    assert CHECK.forged("evoenv:other:rollouts", fields) is not None  # copied to another run
    # a key id that claims the learner's key changes nothing
    forged = {**signed(group(), b"b" * 64), b"key_id": key_id(CHECK.key).encode()}
    assert CHECK.forged(STREAM, forged) is not None


def test_each_role_has_its_reward_range() -> None:
    admission = AdmissionSettings()
    low, high = generator_bounds(admission)
    assert (low, high) == pytest.approx((-1.0, 1.0 + 1.0 + 0.1 * 5.0))
    # the reward table's extremes are inside
    worst = generator_reward({"L1"}, None, None, 2.0, admission).total
    best = generator_reward(set(), admission.target_pass_rate, 0.0, 5.0, admission).total
    assert low <= worst and best <= high
    assert CHECK.out_of_range(group("solver", (0.0, 1.0, None))) is None
    assert CHECK.out_of_range(group("generator", (worst, best, None))) is None
    for role, reward in (("solver", 1.5), ("solver", -0.1), ("generator", high + 0.01)):
        assert f"reward {reward}" in str(CHECK.out_of_range(group(role, (0.0, reward))))
    assert CHECK.out_of_range(group("generator", (low - 0.01,))) is not None
    assert CHECK.out_of_range(group("solver", (float("nan"),))) is not None


def test_the_key_is_the_setting_else_one_file_in_the_data_folder(tmp_path: Path) -> None:
    assert stream_key(Settings(data_dir=tmp_path, stream_key=KEY)) == KEY.encode()
    assert not (tmp_path / KEY_FILE).exists()
    first = stream_key(Settings(data_dir=tmp_path))
    assert len(first) == 64 and (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert stream_key(Settings(data_dir=tmp_path)) == first
    assert stream_key(Settings(data_dir=tmp_path / "elsewhere")) != first


def test_processes_that_need_the_key_at_once_all_get_the_same_one(tmp_path: Path) -> None:
    keys: list[bytes] = []
    start = threading.Barrier(8)

    def get() -> None:
        start.wait()
        keys.append(stream_key(Settings(data_dir=tmp_path)))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]  # no temporary file left


def test_a_short_key_is_refused_and_the_key_is_never_logged(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        Settings(stream_key="short")
    (tmp_path / KEY_FILE).write_text("short\n")
    with pytest.raises(UsageError, match="fewer than 32"):
        stream_key(Settings(data_dir=tmp_path))
    assert KEY not in json.dumps(Settings(stream_key=KEY).masked())
