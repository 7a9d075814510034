"""`bench/bench_proposals.py` without a model: every mode shows proposal i the same examples,
repairs follow the topic run's L1-L5 failures, the table's figures, and `--weights` folders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shared.config import Settings
from shared.errors import UsageError
from shared.messages import StageReport, ValidationReport

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_proposals as bench


def report(failed: str | None, similarity: float | None = None) -> ValidationReport:
    order = ["L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty"]
    # L1-L5 stop at the first failure; the model stages always all run
    last = order.index(failed) if failed in order[:5] else len(order) - 1
    stages = [
        StageReport(
            stage=stage,  # type: ignore[arg-type]
            ok=stage != failed,
            seconds=0.0,
            detail="",
            data={"similarity": similarity} if stage == "novelty" else {},
        )
        for stage in order[: last + 1]
    ]
    verdict = "rejected" if failed else "admitted"
    return ValidationReport(
        file="c.py", name="c", verdict=verdict, failed_stage=failed, stages=stages
    )  # type: ignore[arg-type]


def test_every_mode_shows_proposal_i_the_same_examples() -> None:
    drawn = bench.plans(bench.seed_examples(Settings()), 6, 2, seed=3)
    assert drawn == bench.plans(bench.seed_examples(Settings()), 6, 2, seed=3)  # one draw
    for plan in drawn:
        names = [e.name for e in plan.examples]
        for mode in ("topic", "own_task"):
            text = bench.prompt_of(mode, plan, topics=True)[-1]["content"]
            assert all(f"file {name}.py" in text for name in names), mode
        assert (
            f"file {names[0]}.py" in bench.prompt_of("mutation", plan, topics=True)[-1]["content"]
        )
        assert plan.topic in bench.prompt_of("topic", plan, topics=True)[-1]["content"]


def judged(
    index: int, failed: str | None, reward: float, similarity: float | None = None
) -> bench.Judged:
    asked = [{"role": "user", "content": f"prompt {index}"}]
    return bench.Judged(index, asked, f"reply {index}", 100, report(failed, similarity), reward)


def test_repairs_are_of_the_topic_runs_l1_to_l5_failures_only() -> None:
    topic = bench.Row(
        "topic", 0.7, [judged(0, "L2", -0.9), judged(1, "review", 1.1), judged(2, "L5", -0.5)]
    )
    asked = bench.repairs_of(topic)
    assert [index for index, _ in asked] == [0, 2]
    messages = asked[0][1]
    assert messages[0]["content"] == "prompt 0" and messages[1]["content"] == "reply 0"
    assert "stage L2" in messages[2]["content"]


def test_the_table_per_mode() -> None:
    topic = bench.Row(
        "topic",
        0.7,
        [
            judged(0, None, 2.1, 0.4),
            judged(1, "L2", -0.9),
            judged(2, "calibration", 1.2, 0.6),
            judged(3, "L2", -0.7),
        ],
        seconds=40.0,
    )
    own = bench.Row(
        "own_task", 0.7, [judged(0, None, 2.0, 0.5), judged(1, None, 2.2, 0.3)], seconds=30.0
    )
    header, _, first, second = bench.table([topic, own])
    assert "admitted /100" in header and "mean reward by outcome" in header
    cells = [c.strip() for c in first.strip("|").split("|")]
    # mode, temp, proposals, past L1-L5, admitted/100, vs topic, median similarity, tokens, seconds, rewards
    assert cells[:9] == ["topic", "0.7", "4", "0.50", "25.0", "1.00x", "0.500", "400", "40"]
    assert cells[9] == "L2 -0.80 (2) · calibration +1.20 (1) · admitted +2.10 (1)"
    cells = [c.strip() for c in second.strip("|").split("|")]
    assert cells[:9] == ["own_task", "0.7", "2", "1.00", "100.0", "4.00x", "0.400", "100", "15"]


def test_weights_name_a_model_folder_a_checkpoint_or_a_folder_of_them(tmp_path: Path) -> None:
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert bench.checkpoint_model(model) == model
    root = tmp_path / "checkpoints"
    for step in (3, 12):
        folder = root / f"step-{step:08d}"
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "config.json").write_text("{}")
        (folder / "state.json").write_text(json.dumps({"step": step}))
    assert bench.checkpoint_model(root / "step-00000003") == root / "step-00000003" / "model"
    assert bench.checkpoint_model(root) == root / "step-00000012" / "model"  # the newest
    lora = tmp_path / "lora" / "step-00000001"
    (lora / "adapter").mkdir(parents=True)
    (lora / "state.json").write_text("{}")
    with pytest.raises(UsageError, match="LoRA checkpoint"):
        bench.checkpoint_model(lora)
    with pytest.raises(UsageError, match="neither a model folder nor a checkpoint"):
        bench.checkpoint_model(tmp_path / "empty")


def test_a_search_row_is_compared_with_topic_and_never_becomes_the_baseline() -> None:
    topic = bench.Row("topic", 0.7, [judged(0, None, 2.1, 0.4), judged(1, "calibration", 1.2)])
    searched = bench.Row(
        "topic", 0.7, [judged(0, None, 2.1, 0.4), judged(1, None, 2.0)], note=" +search 2", search=2
    )
    mutation = bench.Row("mutation", 0.7, [judged(0, None, 2.1), judged(1, "L2", -0.9)])
    _, _, *lines = bench.table([topic, searched, mutation])
    ratios = [[c.strip() for c in line.strip("|").split("|")][5] for line in lines]
    assert ratios == ["1.00x", "2.00x", "1.00x"]
    assert lines[1].startswith("| topic +search 2 |")
    assert "| topic +search 2 | 0.7 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 2 |" in bench.funnel(
        [searched]
    )
