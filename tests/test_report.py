"""The run report: every figure is a real, non-blank PNG; the Markdown carries the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from matplotlib.image import imread
from typer.testing import CliRunner

from evoenv_cli import report as report_cli
from evoenv_cli.run_report import (
    FIGURES,
    FUNNEL_STAGES,
    funnel_buckets,
    generator_table,
    groups_table,
    write_report,
)
from evoenv_learner.held_out import wilson
from shared.config import Settings
from shared.db import Archive, MetricRow, source_sha
from shared.env_stats import CalibrationFigures, EnvStats, Quarantine

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN = "paper"


def train_values(step: int, funnel: dict[str, int]) -> dict[str, float | int]:
    """What the learner records at `step`: one candidate judged per step, pushes on even
    steps (2 s on multiples of 4, else 1 s)."""
    stage = FUNNEL_STAGES[step % len(FUNNEL_STAGES)]
    funnel[stage] = funnel.get(stage, 0) + 1
    values: dict[str, float | int] = {
        "loss": 0.5 / step,
        "reward_mean_solver": 0.1 + 0.02 * step,
        "reward_std_solver": 0.15,
        "reward_mean_generator": -0.2 + 0.03 * step,
        "reward_std_generator": 0.3,
        "tokens_per_second": 1000.0 + 10 * step,
        "version": step // 2,
        "pool": 10 + step // 10,
        "stale_dropped": 0,
        **{f"funnel_{k}": v for k, v in funnel.items()},
    }
    if step % 2 == 0:
        values["push_seconds"] = 2.0 if step % 4 == 0 else 1.0
    return values


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    funnel: dict[str, int] = {}
    for step in range(1, 31):
        archive.record_metrics(RUN, step, "train", step // 2, train_values(step, funnel))
    for step, rate in ((10, 0.25), (20, 0.4), (30, 0.6)):
        low, high = wilson(rate, 16)
        values = {"pass_rate": rate, "instances": 16, "ci_low": low, "ci_high": high}
        values |= {"pass_rate_countdown": rate / 2, "pass_rate_sorting": min(1.0, rate * 1.5)}
        archive.record_metrics(RUN, step, "eval", step // 2, values)
    for name in ("countdown", "sorting"):
        archive.add_environment(name, f"# seed {name}\n", status="seed", origin="seed")
    for i, (status, level) in enumerate(
        (("admitted", 3), ("admitted", 3), ("admitted", 5), ("retired", 4))
    ):
        sha = archive.add_environment(f"gen{i}", f"# generated {i}\n", origin="generated")
        calibration = CalibrationFigures(difficulty=level, pass_rate=0.5, passes=4, instances=8)
        stats = EnvStats(admitted_at=1.0, calibration=calibration, serving_difficulty=level + 1)
        archive.update_environment(sha, status=status, stats=stats)
    rejected = archive.add_environment("bad", "# rejected\n", origin="generated")
    archive.update_environment(rejected, status="rejected", stats=EnvStats(funnel="L3"))
    return archive


def assert_real_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 600, (path, image.shape)
    assert np.any(image != image[0, 0]), f"{path} is blank"  # more than one pixel value


def test_the_headline_ends_of_a_short_run_do_not_overlap(tmp_path: Path) -> None:
    """Three steps (`evoenv up --steps 3`): the first step against the last, not the mean of
    all three twice; one step: its value alone."""
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    funnel: dict[str, int] = {}
    for step in range(1, 4):
        archive.record_metrics(RUN, step, "train", step, train_values(step, funnel))
    text = write_report(archive, RUN, tmp_path / "three").markdown.read_text()
    assert "| solver reward, step 1 → step 3 | 0.120 → 0.160 |" in text

    single = Archive(f"sqlite:///{tmp_path / 'one.db'}")
    single.record_metrics(RUN, 1, "train", 1, train_values(1, {}))
    text = write_report(single, RUN, tmp_path / "one").markdown.read_text()
    assert "| solver reward, step 1 | 0.120 |" in text


def test_report_has_every_figure_and_the_headline_numbers(archive: Archive, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / RUN
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps({"run": RUN, "grpo": {"lr": 1e-6}}))

    files = write_report(archive, RUN, folder)

    assert set(files.figures) == set(FIGURES)
    for path in files.figures.values():
        assert path.parent == folder
        assert_real_png(path)
    text = files.markdown.read_text()
    for path in files.figures.values():
        assert f"]({path.name})" in text
    assert "| optimiser steps recorded | 30 (steps 1–30) |" in text
    assert "| final policy version | 15 |" in text
    assert "| solver reward, first 5 → last 5 steps (1–5, 26–30) | 0.160 → 0.660 |" in text
    assert "| generator reward, first 5 → last 5 steps (1–5, 26–30) | -0.110 → 0.640 |" in text
    low, high = wilson(0.25, 16)
    assert f"0.250 [{low:.3f}, {high:.3f}] at step 10 → 0.600 [" in text
    assert "| evaluations | 3 |" in text
    assert "| generated candidates judged (funnel) | 30 |" in text
    assert "| admitted from the funnel | 3 (10.0 %) |" in text
    assert "| environments admitted in the archive | 4 (3 still in the pool) |" in text
    assert "| pool size at the last step | 13 |" in text
    assert "| mean weight-push latency | 1.467 s over 15 pushes |" in text
    assert "| mean throughput | 1155.0 tokens/s |" in text
    assert "| L1 | 3 | 10.0 % |" in text
    assert "| L2 | 4 | 13.3 % |" in text
    assert "| `grpo.lr` | `1e-06` |" in text
    section = text.split("## The generator, per 5 steps\n")[1].split("## Figures")[0]
    assert "| steps | judged | passed L1–L5 | share | review | calibration | novelty |" in section
    # one candidate a step, at FUNNEL_STAGES[step % 9]: 1-5 L2..L5 and review; 6-10
    # calibration, novelty, admitted, L1, L2
    assert "| 1–5 | 5 | 1 | 20.0 % | 1 | 0 | 0 | 0 | 0 |" in section
    assert "| 6–10 | 5 | 3 | 60.0 % | 0 | 1 | 1 | 1 | 0 |" in section
    assert "| 26–30 | 5 | 1 | 20.0 % | 0 | 0 | 0 | 1 | 0 |" in section
    assert "`error`" not in section


def test_funnel_counts_increments_of_the_cumulative_counters_per_ten_steps(
    archive: Archive,
) -> None:
    stages, buckets = funnel_buckets(archive.metrics(RUN, "train"))
    assert stages[: len(FUNNEL_STAGES)] == list(FUNNEL_STAGES)
    assert [sum(b.values()) for b in buckets] == [10, 10, 10]
    assert sum(b["admitted"] for b in buckets) == 3  # steps 8, 17, 26


def test_funnel_counts_again_after_a_counter_reset(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    for step, admitted in ((1, 2), (2, 5), (3, 1), (4, 3)):  # a fresh start after step 2
        archive.record_metrics(RUN, step, "train", 0, {"funnel_admitted": admitted})
    _, buckets = funnel_buckets(archive.metrics(RUN, "train"))
    assert buckets[0]["admitted"] == 5 + 3


def record_funnel(archive: Archive, outcomes: dict[int, dict[str, int]], steps: int) -> None:
    """Train rows for steps 1..`steps` whose cumulative funnel_<stage> counters grow by
    `outcomes[step]` (candidates per outcome counted at that step)."""
    funnel: dict[str, int] = {}
    for step in range(1, steps + 1):
        for outcome, n in outcomes.get(step, {}).items():
            funnel[outcome] = funnel.get(outcome, 0) + n
        values = {"loss": 0.1, **{f"funnel_{k}": v for k, v in funnel.items()}}
        archive.record_metrics(RUN, step, "train", step, values)


def test_generator_table_has_a_row_per_five_steps_the_last_one_partial(tmp_path: Path) -> None:
    """12 steps: rows 1–5, 6–10 and 11–12; calibration never occurs, so it has no column;
    expired candidates are not judged; an error is judged but did not pass L1-L5."""
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    outcomes = {
        1: {"L1": 2},
        3: {"L3": 1, "review": 1},
        5: {"admitted": 1},
        6: {"L2": 1, "novelty": 2},
        9: {"expired": 4},
        11: {"admitted": 2},
        12: {"error": 1},
    }
    record_funnel(archive, outcomes, steps=12)
    table = generator_table(archive.metrics(RUN, "train"))
    assert table[2:] == [
        "| steps | judged | passed L1–L5 | share | review | novelty | error | admitted | expired |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| 1–5 | 5 | 2 | 40.0 % | 1 | 0 | 0 | 1 | 0 |",
        "| 6–10 | 3 | 2 | 66.7 % | 0 | 2 | 0 | 0 | 4 |",
        "| 11–12 | 3 | 2 | 66.7 % | 0 | 0 | 1 | 2 | 0 |",
    ]
    assert "`error`: a check could not run" in table[0]


def test_generator_table_counts_again_after_a_counter_reset(tmp_path: Path) -> None:
    """A fresh start after step 6 sets the counters back to zero: step 7's admitted is 1,
    not 1 - 4; a bucket of only expired candidates has no share."""
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    for step, admitted in ((1, 1), (4, 3), (6, 4), (7, 1), (8, 2)):
        values = {"funnel_admitted": admitted, "funnel_L2": 2 if step <= 6 else 0}
        archive.record_metrics(RUN, step, "train", step, values)
    archive.record_metrics(RUN, 11, "train", 11, {"funnel_admitted": 2, "funnel_expired": 4})
    assert generator_table(archive.metrics(RUN, "train"))[4:] == [
        "| 1–5 | 5 | 3 | 60.0 % | 3 | 0 |",
        "| 6–10 | 3 | 3 | 100.0 % | 3 | 0 |",
        "| 11 | 0 | 0 | – | 0 | 4 |",
    ]


def test_generator_table_says_in_one_line_when_no_candidate_was_judged(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    record_funnel(archive, {}, steps=7)
    assert generator_table(archive.metrics(RUN, "train")) == [
        "No generated candidate judged yet, in any 5 steps."
    ]
    assert generator_table([]) == ["No generated candidate judged yet, in any 5 steps."]


def test_empty_run_writes_placeholder_figures(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    files = write_report(archive, "never-ran", tmp_path / "out")
    assert set(files.figures) == set(FIGURES)
    for path in files.figures.values():
        assert_real_png(path)
    text = files.markdown.read_text()
    assert "0 (no training step recorded yet)" in text
    assert "No generated candidate judged yet." in text
    assert "No `settings.json` in the run folder." in text


def test_cli_writes_the_report_into_the_run_folders_report_folder(
    archive: Archive, tmp_path: Path
) -> None:
    app = typer.Typer()

    @app.callback()
    def root(ctx: typer.Context) -> None:
        ctx.obj = Settings(data_dir=tmp_path, run=RUN)

    report_cli.register(app)
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / RUN
    assert (run_dir / "report" / "report.md").is_file()
    assert str(run_dir / "report" / "reward.png") in result.output

    elsewhere = tmp_path / "elsewhere"
    result = CliRunner().invoke(app, ["report", "other-run", "--out", str(elsewhere)])
    assert result.exit_code == 0, result.output
    assert (elsewhere / "report.md").is_file()
    assert "no metrics recorded for run 'other-run'" in result.output
    assert "runs in the archive: paper" in result.output


def test_the_report_lists_each_generation_groups_outcomes_and_rewards(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'a.db'}")
    candidates = [
        {"outcome": "admitted", "reward": 2.17, "case": "new"},
        {"outcome": "calibration", "reward": 1.32, "case": "calibration"},
        {"outcome": "review", "reward": -0.5, "case": "too similar"},  # a copy, stopped at review
        {"outcome": "novelty", "reward": -0.5, "case": "too similar"},
        {"outcome": "L2", "reward": -0.9, "case": "L2"},
        {"outcome": "error", "reward": None, "case": None},
    ]
    values = {"group_id": "0123456789abcdef", "gamma": 2.0, "candidates": candidates}
    archive.record_metrics(RUN, 1, "generation", 3, values)
    archive.record_metrics(RUN, 1, "train", 3, train_values(1, {}))
    write_report(archive, RUN, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert (
        "| 1 | `01234567` | topic | 3 | 2.00 | admitted +2.17 · calibration +1.32 · review -0.50 "
        "(too similar) · novelty -0.50 · L2 -0.90 · error – |"
    ) in text
    repair = {**values, "mode": "repair", "repair_of": "fedcba9876543210", "candidates": []}
    (line,) = groups_table([MetricRow(run=RUN, step=2, kind="generation", version=4, values=repair)])[-1:]
    assert line.startswith("| 2 | `01234567` | repair of `fedcba98` | 4 | 2.00 |")
    rows = [
        MetricRow(run=RUN, step=n, kind="generation", version=0, values=values) for n in range(1, 5)
    ]
    lines = groups_table(rows, shown=2)
    assert "the last 2 of 4" in lines[0]
    assert [line.split(" |")[0] for line in lines[-2:]] == ["| 3", "| 4"]
    assert groups_table([]) == ["No generation group finalised yet."]


def test_the_headline_has_the_learners_peak_memory_per_step(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    funnel: dict[str, int] = {}
    for step, peak in ((1, 8.0), (2, 9.5), (3, 8.5)):
        values = train_values(step, funnel) | {"peak_rss_gib": peak, "rss_gib": 6.0}
        archive.record_metrics(RUN, step, "train", step, values)
    text = write_report(archive, RUN, tmp_path / "run").markdown.read_text()
    assert (
        "| learner's peak memory per step (its high-water mark) | mean 8.67 GiB, max 9.50 GiB at step 2 |"
        in text
    )


def test_the_headline_counts_the_stream_entries_the_learner_dropped_over_restarts(
    tmp_path: Path,
) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    funnel: dict[str, int] = {}
    # the counters restart from 0 with each learner process: 2, then 3 + 1 after a restart
    for step, forged, out in ((1, 0, 0), (2, 2, 1), (3, 3, 1), (4, 1, 0)):
        values = train_values(step, funnel) | {
            "forged_dropped": forged,
            "out_of_range_dropped": out,
        }
        archive.record_metrics(RUN, step, "train", step, values)
    text = write_report(archive, RUN, tmp_path / "run").markdown.read_text()
    row = "| stream entries dropped: not signed by a worker / a reward out of range | 4 / 1 |"
    assert row in text


def test_the_report_names_the_environments_quarantined_as_dishonest(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    funnel: dict[str, int] = {}
    for step, dropped in ((1, 0), (2, 3), (3, 1)):  # a learner restart before step 3
        values = train_values(step, funnel) | {"quarantined_dropped": dropped}
        archive.record_metrics(RUN, step, "train", step, values)
    why = "a hidden probe: the empty answer scored 1"
    for name, reason in (("lottery", f"dishonest: {why}"), ("flaky", "env_error rate")):
        sha = archive.add_environment(name, f"# {name}\n", origin="generated")
        quarantine = Quarantine(
            reason=reason, gradings=8, env_errors=0, rate=0.0, threshold=0.2, at="2026-01-01"
        )
        stats = EnvStats(admitted_at=1.0, quarantine=quarantine)
        archive.update_environment(sha, status="quarantined", stats=stats)
    text = write_report(archive, RUN, tmp_path / "run").markdown.read_text()
    row = (
        "| environments quarantined as dishonest (a hidden probe or a re-score disagreed) / "
        "groups of quarantined environments dropped untrained | 1 / 4 |"
    )
    assert row in text
    funnel_section = text.split("## Admission funnel")[1].split("## ")[0]
    assert "Admitted, then quarantined as dishonest in training: 1" in funnel_section
    sha = source_sha("# lottery\n")
    assert f"- `lottery` ({sha[:12]}): {why}" in funnel_section
    assert "flaky" not in funnel_section


def test_the_report_lists_the_admitted_environments_and_the_constant_beside_each_evaluation(
    archive: Archive, tmp_path: Path
) -> None:
    first, last = archive.metrics(RUN, "eval")[0], archive.metrics(RUN, "eval")[-1]
    archive.record_metrics(RUN, 0, "eval", 0, {**first.values, "constant_pass_rate": 0.125})
    archive.record_metrics(RUN, 31, "eval", 15, {**last.values, "constant_pass_rate": 0.25})
    folder = tmp_path / "runs" / RUN
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps({"pool_web": {"host": "h", "port": 9}}))
    text = write_report(archive, RUN, folder).markdown.read_text()

    headline = next(line for line in text.splitlines() if "held-out pass rate, first" in line)
    assert "(best constant answer 0.125) at step 0 → " in headline
    assert "(best constant answer 0.250) at step 31" in headline
    section = text.split("## Admitted environments\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| [`gen")]
    assert len(rows) == 4  # the retired one too: it was admitted in the run
    gen0 = archive.find("gen0")
    assert gen0 is not None
    assert rows[0] == (
        f"| [`gen0`](http://h:9/env/{gen0.sha}) | - | 0.500 (4/8) at 3 | 4 | admitted |"
    )
