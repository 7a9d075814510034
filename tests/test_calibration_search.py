"""The calibration search (`admission.calibration_search`): which level it tries next, that a
level it finds is decided on fresh instances only, and what the stage reports in each case."""

from __future__ import annotations

from evoenv_worker.model_stages import calibration_next, calibration_seeds
from shared.config import Settings
from shared.messages import EnvRef, StageJob, StageReport, Trace
from shared.rewards import quality


def settings(search: int) -> Settings:
    return Settings(admission={"calibration_search": search})  # type: ignore[arg-type]


def job(difficulty: int = 3, lo: int = 1, hi: int = 6, search: int = 2) -> StageJob:
    s = settings(search)
    return StageJob(
        job_id="job-1",
        run="default",
        env=EnvRef(name="env", sha="a" * 64, source="x = 1"),
        oracle="equality",
        difficulty=difficulty,
        trace=Trace(seed=0, difficulty=difficulty, prompt="p", reference=1, answer_text="1"),
        seeds=calibration_seeds(s, "job-1", "a" * 64),
        min_difficulty=lo,
        max_difficulty=hi,
    )


def graded(at: StageJob, passes: int, m: int = 8, errors: int = 0) -> StageReport:
    """What `calibration_stage` reports for `passes` of `m` at the job's level."""
    return StageReport(
        stage="calibration",
        ok=0 < passes < m and not errors,
        seconds=1.0,  # type: ignore[arg-type]
        detail=f"pass rate {passes}/{m} at difficulty {at.difficulty}",
        data={
            "pass_rate": passes / m,
            "passes": passes,
            "instances": m,
            "difficulty": at.difficulty,
            "env_errors": errors,
            "quality": round(quality(passes / m, settings(0).admission), 6),
        },
    )


def test_without_the_search_the_first_calibration_decides() -> None:
    first = job(search=0)
    for passes in (0, 3, 8):
        report = graded(first, passes)
        assert calibration_next(first, report, settings(0)) == (None, report)


def test_a_level_inside_at_the_calibration_difficulty_decides_at_once() -> None:
    first = job()
    report = graded(first, 3)
    assert calibration_next(first, report, settings(2)) == (None, report)


def test_too_easy_goes_one_level_harder_and_a_level_found_is_decided_on_fresh_draws() -> None:
    s = settings(2)
    first = job(difficulty=3)
    harder, _ = calibration_next(first, graded(first, 8), s)
    assert harder is not None and harder.difficulty == 4 and not harder.confirm
    assert not set(harder.seeds) & set(first.seeds) and len(harder.seeds) == len(first.seeds)
    assert [(p.difficulty, p.passes) for p in harder.probes] == [(3, 8)]
    # 3 of 8 at level 4: chosen on these draws, so it does not decide; fresh ones at 4 do
    confirm, interim = calibration_next(harder, graded(harder, 3), s)
    assert confirm is not None and confirm.confirm and confirm.difficulty == 4
    assert not set(confirm.seeds) & (set(harder.seeds) | set(first.seeds))
    assert not interim.ok or interim.data["difficulty"] == 4
    # the fresh calibration inside (0, 1): admitted at level 4, its figures, the search listed
    done, report = calibration_next(confirm, graded(confirm, 2), s)
    assert done is None and report.ok
    assert report.data["difficulty"] == 4 and report.data["pass_rate"] == 0.25
    assert report.data["search"] == [
        {"difficulty": 3, "passes": 8, "instances": 8},
        {"difficulty": 4, "passes": 3, "instances": 8},
    ]
    assert "the search tried 8/8 at 3, 3/8 at 4 first" in report.detail


def test_a_level_not_confirmed_rejects_with_the_calibration_difficultys_figures() -> None:
    s = settings(2)
    first = job(difficulty=3)
    easier, _ = calibration_next(first, graded(first, 0), s)
    assert easier is not None and easier.difficulty == 2
    confirm, _ = calibration_next(easier, graded(easier, 1), s)
    assert confirm is not None and confirm.confirm
    done, report = calibration_next(confirm, graded(confirm, 0), s)
    assert done is None and not report.ok
    # a and Q are the calibration difficulty's: the reward of a rejected file does not move
    assert report.data["difficulty"] == 3 and report.data["pass_rate"] == 0.0
    assert report.data["quality"] == graded(first, 0).data["quality"]
    assert [p["difficulty"] for p in report.data["search"]] == [2, 2]
    assert "no level inside (0, 1) after the search: 1/8 at 2, 0/8 at 2" in report.detail


def test_the_search_stops_at_its_budget_the_range_and_a_level_already_tried() -> None:
    s = settings(1)
    first = job(difficulty=3)
    harder, _ = calibration_next(first, graded(first, 8), s)
    assert harder is not None
    done, report = calibration_next(harder, graded(harder, 8), s)  # budget of one level spent
    assert done is None and not report.ok and report.data["difficulty"] == 3
    # the easiest level never solved: nothing easier to try, the report as it was
    lowest = job(difficulty=1)
    plain = graded(lowest, 0)
    assert calibration_next(lowest, plain, settings(3)) == (None, plain)
    # solved at 3, never at 4: the frontier lies between two levels, no going back to 3
    harder, _ = calibration_next(first, graded(first, 8), settings(3))
    assert harder is not None
    done, report = calibration_next(harder, graded(harder, 0), settings(3))
    assert done is None and not report.ok and report.data["search"][0]["difficulty"] == 4


def test_a_scorer_failure_at_a_searched_level_decides() -> None:
    s = settings(2)
    first = job(difficulty=3)
    harder, _ = calibration_next(first, graded(first, 8), s)
    assert harder is not None
    broken = graded(harder, 2, errors=1)
    done, report = calibration_next(harder, broken, s)
    assert done is None and not report.ok and report.data["env_errors"] == 1
