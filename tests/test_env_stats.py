"""An environment's typed stats, and an archive written by version 1 (stats a free dict then)
opened by this version: read as it is, or refused with one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import StatementError

from evoenv_learner.pool import Pool
from shared.config import PoolSettings
from shared.db import Archive, EnvironmentRow
from shared.env_stats import EnvStats, Retirement, Served
from shared.errors import SchemaMismatch
from shared.rewards import RewardParts

V1_TABLES = """
CREATE TABLE environments (
    sha VARCHAR NOT NULL, name VARCHAR NOT NULL, source VARCHAR NOT NULL,
    status VARCHAR NOT NULL, origin VARCHAR NOT NULL, parents JSON, stats JSON,
    embedding JSON, created_at DATETIME NOT NULL, updated_at DATETIME NOT NULL,
    PRIMARY KEY (sha)
);
CREATE TABLE schema_version (
    version INTEGER NOT NULL, applied_at DATETIME NOT NULL, PRIMARY KEY (version)
);
INSERT INTO schema_version VALUES (1, '2026-01-01 00:00:00.000000');
"""
"""The two tables of a version-1 archive that matter here, as version 1 created them."""

AT = "2026-01-02T03:04:05.678901+00:00"
V1_STATS: dict[str, dict[str, Any] | None] = {
    "admitted": {  # a generated environment, admitted, then served and searched
        "judged_at": 1767225600.25,
        "admitted_at": 1767225600.25,
        "calibration": {
            "pass_rate": 0.25,
            "passes": 2,
            "instances": 8,
            "difficulty": 4,
            "env_errors": 0,
            "quality": 0.731616,
        },
        "calibration_difficulty": 4,
        "novelty": {"similarity": 0.41, "nearest": None},
        "reward": {
            "total": 1.9,
            "base": 1.0,
            "quality": 0.73,
            "bonus": 0.17,
            "gamma": 0.9,
            "failed_stage": None,
        },
        "funnel": "admitted",
        "uses": 12,
        "epochs": 0,
        "recent_groups": ["g1", "g2"],
        "gradings": 96,
        "env_errors": 1,
        "served": {"4": {"scored": 95, "passes": 30}},
        "serving_difficulty": 5,
        "serving_curve": {"4": 0.5, "5": 0.3125},
        "pass_rate_history": [{"at": AT, "level": 5, "curve": {"4": 0.5, "5": 0.3125}}],
    },
    "expired": {  # a candidate whose generation group expired: no reward
        "judged_at": 1767225601.0,
        "calibration": {"error": True},
        "novelty": {"similarity": 1.0, "nearest": "sort_words", "same_oracle": "sort_words"},
        "reward": None,
        "funnel": "expired",
        "expired": "expired: not in the stream 600 s after it was sent",
    },
    "clash": {"judged_at": 1.5, "calibration": {}, "funnel": "name clash"},
    "quarantined": {
        "gradings": 28,
        "env_errors": 6,
        "quarantine": {
            "reason": "env_error rate",
            "gradings": 28,
            "env_errors": 6,
            "rate": 0.21428571428571427,
            "threshold": 0.2,
            "at": AT,
        },
    },
    "rotated": {"uses": 12, "epochs": 3, "retired": {"reason": "rotation", "epochs": 3, "at": AT}},
    "superseded": {"retired": {"reason": "superseded seed", "at": AT}},
    "fresh": {},
    "null": None,
}
STATUS = {"admitted": "admitted", "quarantined": "quarantined", "null": "seed"}


def v1_archive(path: Path, stats: dict[str, dict[str, Any] | None]) -> str:
    """An archive as version 1 left it: its rows' stats inserted as JSON, as it stored them."""
    with sqlite3.connect(path) as db:
        db.executescript(V1_TABLES)
        for name, value in stats.items():
            db.execute(
                "INSERT INTO environments VALUES (?, ?, ?, ?, ?, '[]', ?, NULL, ?, ?)",
                (
                    f"sha-{name}",
                    name,
                    f"# {name}\n",
                    STATUS.get(name, "rejected"),
                    "seed" if name == "null" else "generated",
                    None if value is None else json.dumps(value),
                    "2026-01-01 00:00:00.000000",
                    "2026-01-01 00:00:00.000000",
                ),
            )
    return f"sqlite:///{path}"


def stored(path: Path, sha: str) -> Any:
    with sqlite3.connect(path) as db:
        (text,) = db.execute("SELECT stats FROM environments WHERE sha = ?", (sha,)).fetchone()
    return json.loads(text)


def test_every_stats_version_1_wrote_reads_into_the_model_as_it_was(tmp_path: Path) -> None:
    archive = Archive(v1_archive(tmp_path / "v1.db", V1_STATS))
    for name, value in V1_STATS.items():
        row = archive.environment(f"sha-{name}")
        assert row is not None and isinstance(row.stats, EnvStats)
        assert row.stats.to_json() == (value or {}), name  # the same JSON: nothing lost
    admitted = archive.environment("sha-admitted")
    assert admitted is not None
    stats = admitted.stats
    assert stats.calibration is not None and stats.calibration.difficulty == 4
    assert stats.reward == RewardParts(
        total=1.9, base=1.0, quality=0.73, bonus=0.17, gamma=0.9, failed_stage=None
    )
    assert stats.served == {"4": Served(scored=95, passes=30)}
    assert [search.level for search in stats.pass_rate_history] == [5]
    with sqlite3.connect(tmp_path / "v1.db") as db:
        versions = [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == [1, 2]  # this version recorded beside the first


def test_the_pool_updates_a_version_1_row_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    archive = Archive(v1_archive(path, {"admitted": V1_STATS["admitted"]}))
    pool = Pool(archive, PoolSettings())
    (entry,) = pool.members
    assert (entry.difficulty, entry.searched, entry.solve_rate) == (5, True, 30 / 95)
    pool.record_gradings("sha-admitted", 8, 0, passes=4, difficulty=4, group_id="g3")
    pool.record_use("sha-admitted", 1)
    before = V1_STATS["admitted"]
    assert before is not None
    assert stored(path, "sha-admitted") == {
        **before,
        "uses": 13,
        "recent_groups": ["g1", "g2", "g3"],
        "gradings": 104,
        "served": {"4": {"scored": 103, "passes": 34}},
    }


def test_stats_round_trip_and_hold_only_what_was_set() -> None:
    stats = EnvStats(judged_at=2.0, reward=None, funnel="expired")
    assert stats.to_json() == {"judged_at": 2.0, "reward": None, "funnel": "expired"}
    stats.recent_groups.append("g")  # changed in place: still written
    stats.retired = Retirement(reason="manual", at=AT)
    again = EnvStats.from_json(json.loads(json.dumps(stats.to_json())))
    assert again == stats and again.to_json() == stats.to_json()
    assert again.to_json()["retired"] == {"reason": "manual", "at": AT}  # no epochs: not set
    assert EnvStats().to_json() == {} and EnvStats.from_json(None) == EnvStats()
    merged = again.merged(EnvStats(uses=3, funnel="admitted"))
    assert (merged.uses, merged.funnel, merged.recent_groups) == (3, "admitted", ["g"])


def test_stats_are_written_as_the_model_and_checked_on_write() -> None:
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        EnvStats.model_validate({"uses": 1, "pass_rate": 0.5})
    stats = EnvStats()
    with pytest.raises(ValueError, match="valid integer"):
        stats.uses = "many"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="funnel"):
        EnvStats(funnel="maybe")  # type: ignore[arg-type]


def test_a_row_with_a_key_no_version_wrote_is_refused_in_one_line(tmp_path: Path) -> None:
    archive = Archive(v1_archive(tmp_path / "v1.db", {"odd": {"uses": 2, "popularity": 9}}))
    with pytest.raises(SchemaMismatch) as caught:
        archive.environment("sha-odd")
    message = str(caught.value)
    assert "\n" not in message and "popularity: Extra inputs are not permitted" in message


def test_an_archive_a_newer_version_opened_is_refused_in_one_line(tmp_path: Path) -> None:
    url = v1_archive(tmp_path / "v3.db", {"fresh": {}})
    with sqlite3.connect(tmp_path / "v3.db") as db:
        db.execute("INSERT INTO schema_version VALUES (3, '2026-02-01 00:00:00.000000')")
    with pytest.raises(SchemaMismatch) as caught:
        Archive(url)
    message = str(caught.value)
    assert "\n" not in message
    assert "archive schema version 3; this EvoEnv reads versions up to 2" in message
    assert "EVOENV_DATABASE_URL" in message  # what to do


def test_a_row_is_written_only_through_the_model(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'a.db'}")
    sha = archive.add_environment("e", "# e\n")
    with archive.session() as session, pytest.raises(StatementError, match="written as EnvStats"):
        row = session.get(EnvironmentRow, sha)
        assert row is not None
        row.stats = {"uses": 1}  # type: ignore[assignment]
        session.add(row)
        session.commit()
