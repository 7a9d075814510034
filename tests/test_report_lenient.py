"""The run report beside the lenient pass rate: its headline row and its line in the held-out
figure, where the evaluations recorded it; nothing of it where they did not."""

from __future__ import annotations

from pathlib import Path

from evoenv_cli.run_report import write_report
from evoenv_learner.held_out import wilson
from shared.db import Archive

RUN = "measured"


def record_evals(archive: Archive, lenient: bool) -> None:
    for step, rate in ((10, 0.25), (20, 0.5)):
        low, high = wilson(rate, 16)
        values = {"pass_rate": rate, "instances": 16, "ci_low": low, "ci_high": high}
        if lenient:
            loose_low, loose_high = wilson(rate + 0.25, 16)
            values |= {
                "lenient_pass_rate": rate + 0.25,
                "lenient_ci_low": loose_low,
                "lenient_ci_high": loose_high,
            }
        archive.record_metrics(RUN, step, "eval", step // 2, values)


def test_the_headline_has_the_lenient_pass_rate_beside_the_strict_one(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    record_evals(archive, lenient=True)
    text = write_report(archive, RUN, tmp_path / "run").markdown.read_text()
    strict = [wilson(rate, 16) for rate in (0.25, 0.5)]
    loose = [wilson(rate, 16) for rate in (0.5, 0.75)]
    assert (
        "| held-out pass rate, first → last evaluation | "
        f"0.250 [{strict[0][0]:.3f}, {strict[0][1]:.3f}] at step 10 → "
        f"0.500 [{strict[1][0]:.3f}, {strict[1][1]:.3f}] at step 20 |"
    ) in text
    assert (
        "| held-out lenient pass rate (the answer taken leniently), first → last | "
        f"0.500 [{loose[0][0]:.3f}, {loose[0][1]:.3f}] at step 10 → "
        f"0.750 [{loose[1][0]:.3f}, {loose[1][1]:.3f}] at step 20 |"
    ) in text


def test_evaluations_without_a_lenient_rate_have_no_lenient_row(tmp_path: Path) -> None:
    archive = Archive(f"sqlite:///{tmp_path / 'archive.db'}")
    record_evals(archive, lenient=False)
    text = write_report(archive, RUN, tmp_path / "run").markdown.read_text()
    assert "| held-out pass rate, first → last evaluation |" in text
    assert "lenient" not in text
