"""The learning test's line from its pure helpers (`tests/e2e/test_it_learns.py` itself runs
the real model): the strict pairs, the non-modal ones, and the same pairs taken leniently."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

# The e2e folder is on the path only when pytest collects a test in it.
sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))
import test_it_learns as learns


def run(rows: list[tuple[float, str | None, float, float]], constant: float) -> dict[str, Any]:
    """An `evoenv eval --json` environment object: per instance (reward, answer, lenient
    reward, constant's reward)."""
    records = [
        {
            "seed": seed,
            "reward": reward,
            "answer": answer,
            "lenient_reward": lenient,
            "lenient_answer": answer or "x",
            "constant_reward": constant_reward,
        }
        for seed, (reward, answer, lenient, constant_reward) in enumerate(rows)
    ]
    return {"records": records, "best_constant": {"answer": "3", "score": constant}}


def test_the_line_says_whether_format_or_content_moved() -> None:
    # Before: four untagged answers, two of them right when taken leniently, one tagged and
    # right, one tagged and wrong. After: every answer tagged; the two lenient passes stay,
    # the wrong one becomes right, and one untagged wrong answer stays wrong.
    before = run(
        [
            (0.0, None, 1.0, 0.0),
            (0.0, None, 1.0, 0.0),
            (0.0, None, 0.0, 1.0),
            (0.0, None, 0.0, 0.0),
            (1.0, "3", 1.0, 1.0),
            (0.0, "4", 0.0, 0.0),
        ],
        constant=2 / 6,
    )
    after = run(
        [
            (1.0, "5", 1.0, 0.0),
            (1.0, "6", 1.0, 0.0),
            (0.0, "2", 0.0, 1.0),
            (0.0, "7", 0.0, 0.0),
            (1.0, "3", 1.0, 1.0),
            (1.0, "8", 1.0, 0.0),
        ],
        constant=2 / 6,
    )
    result = learns.compare(before, after)
    assert (result["b"], result["c"], result["b_lenient"], result["c_lenient"]) == (3, 0, 1, 0)
    assert (result["before"], result["after"]) == (1 / 6, 4 / 6)
    assert (result["lenient_before"], result["lenient_after"]) == (3 / 6, 4 / 6)
    assert result["p"] == learns.sign_test(3, 0) == 1 / 8
    assert result["p_lenient"] == learns.sign_test(1, 0) == 1 / 2
    line = result["line"]
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert line.startswith("it-learns: ")
    assert fields["fmt_err_before"] == "4" and fields["fmt_err_after"] == "0"
    assert (fields["lenient_before"], fields["lenient_after"]) == ("0.500", "0.667")
    assert (fields["b_lenient"], fields["c_lenient"], fields["p_lenient"]) == ("1", "0", "0.5")
    assert (fields["b"], fields["c"], fields["b_nm"], fields["c_nm"]) == ("3", "0", "3", "0")


def test_paired_counts_both_directions_on_the_seeds_given() -> None:
    old = {1: True, 2: False, 3: False, 4: True}
    new = {1: False, 2: True, 3: True, 4: True}
    assert learns.paired(old, new) == (2, 1)
    assert learns.paired(old, new, {1, 2}) == (1, 1)
    assert learns.paired(old, new, set()) == (0, 0)


def test_the_untuned_environments_script_reads_the_line_into_its_table() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import it_learns_untuned as script

    records = [(0.0, None, 1.0, 0.0), (1.0, "a b", 1.0, 1.0)]
    line = learns.compare(run(records, 0.5), run(records, 0.5))["line"]
    fields = script.parse_line(line)
    assert fields["answer"] == "'3'" and fields["lenient_before"] == "1.000"
    text = script.table([(fields, False, 1234.5)], "python bench/it_learns_untuned.py")
    row = text.splitlines()[2]
    assert row.startswith(f"| {learns.ENV}, {learns.DIFFICULTY} | 0.500 → 0.500 | 1.000 → 1.000 |")
    assert "| 0.500 ('3') | 1 → 1 | failed | 1,234 |" in row
    assert "CPU: " in text and "`python bench/it_learns_untuned.py`" in text
