"""The pool on a SQLite archive: seeds, the seed floor, rotation and quarantine."""

from __future__ import annotations

import math
import random
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import structlog

from evoenv_learner.pool import Pool, PoolEmpty, PoolEntry, seed_pool
from shared.config import PoolSettings
from shared.db import Archive, EnvironmentRow, source_sha
from shared.env_stats import CalibrationFigures, EnvStats, Served
from shared.errors import UsageError

SEEDS_DIR = Path(__file__).resolve().parents[1] / "seeds"


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    return Archive(f"sqlite:///{tmp_path / 'archive.db'}")


def add_admitted(archive: Archive, count: int) -> list[str]:
    """Admitted environments with distinct (fake) sources, in one transaction; never run."""
    rows = [
        EnvironmentRow(
            sha=source_sha(f"# generated {i}\n"),
            name=f"generated_{i}",
            source=f"# generated {i}\n",
            status="admitted",
            origin="generated",
        )
        for i in range(count)
    ]
    shas = [row.sha for row in rows]
    with archive.session() as session:
        session.add_all(rows)
        session.commit()
    return shas


def status_of(archive: Archive, sha: str) -> str:
    row = archive.environment(sha)
    assert row is not None
    return row.status


def test_seed_pool_records_the_ten_seeds_once(archive: Archive) -> None:
    shas = seed_pool(archive, SEEDS_DIR)
    assert len(shas) == len(set(shas)) == 10
    rows = archive.environments("seed")
    assert {r.sha for r in rows} == set(shas)
    assert {r.origin for r in rows} == {"seed"}
    assert {r.name for r in rows} == {p.stem for p in SEEDS_DIR.glob("*.py")}

    pool = Pool(archive, PoolSettings())
    pool.record_use(shas[0], 5)
    assert seed_pool(archive, SEEDS_DIR) == shas  # idempotent by content hash...
    assert len(archive.environments()) == 10
    row = archive.environment(shas[0])
    assert row is not None and row.stats.uses == 5  # ...and the stats are kept


def test_seed_pool_retires_a_superseded_seed(archive: Archive, tmp_path: Path) -> None:
    folder = tmp_path / "seeds"
    shutil.copytree(SEEDS_DIR, folder, ignore=shutil.ignore_patterns("__pycache__"))
    old = seed_pool(archive, folder)
    edited = folder / "sort_words.py"
    edited.write_text(edited.read_text() + "\n# edited\n")
    new = seed_pool(archive, folder)
    (gone,) = set(old) - set(new)
    assert status_of(archive, gone) == "retired"
    assert len(archive.environments("seed")) == 10
    assert len(Pool(archive, PoolSettings()).seeds) == 10


def test_a_seed_with_a_byte_order_mark_is_stored_as_the_text_l1_judged(
    archive: Archive, tmp_path: Path
) -> None:
    text = (SEEDS_DIR / "sort_words.py").read_text("utf-8")
    (tmp_path / "sort_words.py").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    (sha,) = seed_pool(archive, tmp_path)
    row = archive.environment(sha)
    assert row is not None and row.source == text and row.sha == source_sha(text)


def test_seed_pool_refuses_an_empty_or_broken_folder(archive: Archive, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no seed"):
        seed_pool(archive, tmp_path)
    (tmp_path / "broken.py").write_text("class X:\n    pass\n")
    with pytest.raises(UsageError, match="fails L1"):
        seed_pool(archive, tmp_path)


def test_seed_share_never_drops_below_the_floor(archive: Archive) -> None:
    seed_pool(archive, SEEDS_DIR)
    add_admitted(archive, 200)
    settings = PoolSettings()
    pool = Pool(archive, settings)
    assert (len(pool.seeds), len(pool)) == (10, 210)

    draws = 10_000
    rng = random.Random(1234)
    picks = [pool.choose(rng) for _ in range(draws)]
    share = sum(p.is_seed for p in picks) / draws

    # With probability 0.2 a seed, else uniform over all 210 members (10 seeds among them):
    # the seeds' share is p = 0.2 + 0.8 x 10/210 = 0.2381. Over n = 10,000 independent draws
    # the observed share has standard deviation sqrt(p(1-p)/n) = 0.0043, so the floor 0.2 lies
    # 8.9 standard deviations below p (a false failure has probability < 1e-18), and the
    # observed share stays within 4 standard deviations of p (false failure ~ 6e-5).
    p = settings.seed_share + (1 - settings.seed_share) * 10 / 210
    sd = math.sqrt(p * (1 - p) / draws)
    assert share >= settings.seed_share
    assert abs(share - p) < 4 * sd
    seeds_drawn = Counter(pick.name for pick in picks if pick.is_seed)
    assert len(seeds_drawn) == 10  # every seed gets its turn


def test_a_weighted_draw_follows_the_weights_and_keeps_the_seed_floor(archive: Archive) -> None:
    seed_pool(archive, SEEDS_DIR)
    add_admitted(archive, 10)
    pool = Pool(archive, PoolSettings())
    heavy = pool.seeds[0].sha
    # every admitted member weighs almost nothing, one seed 9 times as much as the others
    weights = {
        e.sha: 1e-6 if not e.is_seed else 9.0 if e.sha == heavy else 1.0 for e in pool.members
    }
    draws = 10_000
    rng = random.Random(7)
    picks = [pool.choose(rng, lambda e: weights[e.sha]) for _ in range(draws)]
    # Seeds are 18 of the 18 + 10e-6 weight in both draws, so about every pick is a seed, and
    # the heavy one is 9 / 18 of them: 0.5, standard deviation 0.005 over 10,000 draws.
    assert sum(p.is_seed for p in picks) >= draws - 2
    assert abs(sum(p.sha == heavy for p in picks) / draws - 0.5) < 4 * 0.005
    # Admitted members weighing 1000 times a seed: the seeds still get their floor of 0.2.
    weights = {e.sha: 1.0 if e.is_seed else 1000.0 for e in pool.members}
    share = sum(pool.choose(rng, lambda e: weights[e.sha]).is_seed for _ in range(draws)) / draws
    assert share >= 0.2 - 4 * math.sqrt(0.2 * 0.8 / draws)


@pytest.mark.parametrize("admitted", [0, 10, 2000])
def test_seed_floor_at_any_pool_size(archive: Archive, admitted: int) -> None:
    seed_pool(archive, SEEDS_DIR)
    add_admitted(archive, admitted)
    pool = Pool(archive, PoolSettings())
    draws = 10_000
    rng = random.Random(admitted)
    share = sum(pool.choose(rng).is_seed for _ in range(draws)) / draws
    # The true share is at least 0.2 (exactly 1 with seeds alone); the observed one may sit
    # below it by noise only: 4 standard deviations of a 0.2 share over 10,000 draws,
    # 4 x sqrt(0.2 x 0.8 / 10,000) = 0.016 (one-sided false failure ~ 3e-5).
    assert share >= 0.2 - 4 * math.sqrt(0.2 * 0.8 / draws)
    if admitted == 0:
        assert share == 1.0


def test_empty_pool_raises(archive: Archive) -> None:
    with pytest.raises(PoolEmpty):
        Pool(archive, PoolSettings()).choose(random.Random(0))


def test_rotation_retires_after_the_configured_epochs(archive: Archive) -> None:
    seeds = seed_pool(archive, SEEDS_DIR)
    (sha,) = add_admitted(archive, 1)
    settings = PoolSettings(retire_after_epochs=3, epoch_instances=4)
    pool = Pool(archive, settings)
    assert sha in pool

    for _ in range(11):  # 11 instances: 2 whole epochs
        assert pool.record_use(sha, 1) == "admitted"
    row = archive.environment(sha)
    assert row is not None and (row.stats.uses, row.stats.epochs) == (11, 2)
    assert sha in pool

    with structlog.testing.capture_logs() as logs:
        assert pool.record_use(sha, 1) == "retired"  # the 12th instance ends epoch 3
    assert status_of(archive, sha) == "retired"
    row = archive.environment(sha)
    assert row is not None and row.stats.retired is not None
    assert row.stats.retired.reason == "rotation"
    assert any(e["event"] == "env_retired" and e["env_sha"] == sha for e in logs)
    assert sha not in pool
    rng = random.Random(0)
    assert all(pool.choose(rng).sha != sha for _ in range(2000))
    assert sha not in Pool(archive, settings)  # a fresh pool reads the same from the archive

    assert pool.record_use(seeds[0], 1000) == "seed"  # seeds never retire
    assert seeds[0] in pool


def test_a_dishonest_environment_is_quarantined_at_once_and_a_seed_is_not(
    archive: Archive,
) -> None:
    seeds = seed_pool(archive, SEEDS_DIR)
    (sha,) = add_admitted(archive, 1)
    pool = Pool(archive, PoolSettings())
    assert not pool.quarantined(sha)
    why = "a hidden probe: the empty answer scored 1"
    with structlog.testing.capture_logs() as logs:
        assert pool.record_dishonest(sha, why) == "quarantined"  # no grading counted yet
        assert pool.record_dishonest(seeds[0], why) == "seed"
    row = archive.environment(sha)
    assert row is not None and row.status == "quarantined" and row.stats.quarantine is not None
    assert row.stats.quarantine.reason == f"dishonest: {why}"
    assert sha not in pool and pool.quarantined(sha)
    assert Pool(archive, PoolSettings()).quarantined(sha)  # read back from the archive
    assert seeds[0] in pool and not pool.quarantined(seeds[0])
    events = [(e["event"], e["env_sha"]) for e in logs]
    assert events == [("env_quarantined", sha), ("seed_dishonest", seeds[0])]


def test_quarantine_after_repeated_env_errors(archive: Archive) -> None:
    seeds = seed_pool(archive, SEEDS_DIR)
    (sha,) = add_admitted(archive, 1)
    pool = Pool(archive, PoolSettings(quarantine_error_rate=0.2, quarantine_min_gradings=16))

    assert pool.record_gradings(sha, 4, 4) == "admitted"  # 100 % but only 4 gradings
    assert pool.record_gradings(sha, 8, 0, passes=3, difficulty=5) == "admitted"
    assert pool.record_gradings(sha, 8, 0) == "admitted"  # 20 gradings, 4 errors: 0.20, not above
    with structlog.testing.capture_logs() as logs:
        assert pool.record_gradings(sha, 8, 2) == "quarantined"  # 28 gradings, 6 errors: 0.21
    row = archive.environment(sha)
    assert row is not None and row.status == "quarantined"
    assert (row.stats.gradings, row.stats.env_errors) == (28, 6)
    assert row.stats.quarantine is not None
    assert row.stats.quarantine.rate == pytest.approx(6 / 28)
    assert row.stats.served == {"5": Served(scored=8, passes=3)}
    (event,) = [e for e in logs if e["event"] == "env_quarantined"]
    assert event["env_sha"] == sha and event["log_level"] == "warning"
    assert sha not in pool

    for _ in range(10):  # a seed is never quarantined: its errors are a bug to look into
        assert pool.record_gradings(seeds[0], 8, 8) == "seed"
    assert seeds[0] in pool


def test_a_group_read_again_after_a_restart_is_counted_once(archive: Archive) -> None:
    (sha,) = add_admitted(archive, 1)
    pool = Pool(archive, PoolSettings())
    pool.record_gradings(sha, 8, 1, passes=3, difficulty=2, group_id="g1")
    pool.record_gradings(sha, 8, 0, passes=5, difficulty=2, group_id="g2")
    # the learner restarts from a checkpoint taken before both: the stream hands them again
    fresh = Pool(archive, PoolSettings())
    fresh.record_gradings(sha, 8, 1, passes=3, difficulty=2, group_id="g1")
    fresh.record_gradings(sha, 8, 0, passes=5, difficulty=2, group_id="g2")
    row = archive.environment(sha)
    assert row is not None
    assert (row.stats.gradings, row.stats.env_errors) == (16, 1)
    assert row.stats.served == {"2": Served(scored=15, passes=8)}
    for index in range(300):  # only the last RECENT_GROUPS ids are kept
        fresh.record_gradings(sha, 1, 0, group_id=f"x{index}")
    row = archive.environment(sha)
    assert row is not None and len(row.stats.recent_groups) == 256
    assert row.stats.gradings == 316


def test_solve_rate_over_every_level_once_enough_answers_are_graded(archive: Archive) -> None:
    (sha,) = add_admitted(archive, 1)
    pool = Pool(archive, PoolSettings())
    pool.record_gradings(sha, 4, 0, passes=1, difficulty=2)
    pool.refresh()
    assert _member(pool, sha).solve_rate is None  # 4 answers: not known yet
    pool.record_gradings(sha, 8, 2, passes=2, difficulty=3)  # env_errors are not answers
    pool.record_gradings(sha, 8, 0)  # no pass counts: not counted either
    pool.refresh()
    assert _member(pool, sha).solve_rate == 3 / 10


def _member(pool: Pool, sha: str) -> PoolEntry:
    return next(m for m in pool.members if m.sha == sha)


def test_serving_difficulty_and_history_are_kept(archive: Archive) -> None:
    (sha,) = add_admitted(archive, 1)
    with archive.session() as session:  # admission's own figures must survive our updates
        row = session.get(EnvironmentRow, sha)
        assert row is not None
        row.stats = EnvStats(
            calibration_difficulty=5, calibration=CalibrationFigures(pass_rate=0.25)
        )
        session.add(row)
        session.commit()
    pool = Pool(archive, PoolSettings())
    assert pool.members[0].difficulty == 5  # before any search: the calibration difficulty

    pool.set_serving_difficulty(sha, 7, {5: 0.75, 8: 0.125, 7: 0.25})
    pool.set_serving_difficulty(sha, 6, {7: 0.125, 6: 0.375})
    pool.record_use(sha, 3)
    row = archive.environment(sha)
    assert row is not None
    assert row.stats.calibration_difficulty == 5
    assert row.stats.calibration == CalibrationFigures(pass_rate=0.25)
    assert row.stats.serving_difficulty == 6
    assert row.stats.serving_curve == {"6": 0.375, "7": 0.125}
    assert [h.level for h in row.stats.pass_rate_history] == [7, 6]
    assert pool.members[0].difficulty == 6
    assert Pool(archive, PoolSettings()).members[0].difficulty == 6


def test_new_admissions_join_on_refresh(archive: Archive) -> None:
    seed_pool(archive, SEEDS_DIR)
    now = [0.0]
    pool = Pool(archive, PoolSettings(), refresh_seconds=10.0, clock=lambda: now[0])
    (sha,) = add_admitted(archive, 1)
    assert sha not in pool
    now[0] = 10.0
    pool.choose(random.Random(0))  # past refresh_seconds: re-read the archive
    assert sha in pool and len(pool) == 11


def test_manual_retire_spares_seeds(archive: Archive) -> None:
    seeds = seed_pool(archive, SEEDS_DIR)
    (sha,) = add_admitted(archive, 1)
    pool = Pool(archive, PoolSettings())
    pool.retire(sha)
    assert status_of(archive, sha) == "retired" and sha not in pool
    with pytest.raises(UsageError):
        pool.retire(seeds[0])
    assert status_of(archive, seeds[0]) == "seed"


def test_concurrent_updates_lose_no_count(archive: Archive) -> None:
    (sha,) = add_admitted(archive, 1)
    settings = PoolSettings(retire_after_epochs=1000)
    pools = [Pool(archive, settings) for _ in range(4)]

    def work(pool: Pool) -> None:
        for _ in range(25):
            pool.record_use(sha, 1)
            pool.record_gradings(sha, 2, 0)

    with ThreadPoolExecutor(len(pools)) as executor:
        list(executor.map(work, pools))
    row = archive.environment(sha)
    assert row is not None
    assert (row.stats.uses, row.stats.gradings) == (100, 200)
