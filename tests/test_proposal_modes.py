"""The proposal modes' prompt builders (`shared/proposal_modes.py`): what each prompt must hold,
the own-task first line, and the draw of a mode (pure: no services)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evoenv_worker.proposal_code import written_code
from shared.messages import StageReport, Trigger, ValidationReport
from shared.proposal_modes import (
    draw_mode,
    failure_text,
    mutation_messages,
    own_task_messages,
    own_task_of,
    repair_messages,
    repairable,
    sample_code,
)
from shared.proposal_prompt import Example, proposal_messages

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
LIS = Example(
    "longest_increasing_subsequence",
    "equality",
    (SEEDS / "longest_increasing_subsequence.py").read_text(),
    "sha-lis",
)
SORT = Example("sort_words", "equality", (SEEDS / "sort_words.py").read_text(), "sha-sort")


def user_text(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"]


def test_the_mutation_prompt_holds_the_members_sample_code_and_the_same_oracle_rule() -> None:
    sample = sample_code(LIS.source)
    assert sample is not None and sample.lstrip().startswith("def sample(self, rng")
    assert "return" in sample and sample in LIS.source  # the method as written, whole
    text = user_text(mutation_messages(LIS))
    assert f"```python\n{sample.rstrip()}\n```" in text  # quoted on its own, to copy
    assert "class LongestIncreasingSubsequence" in text  # and the whole file beside it
    assert "DIFFERENT question about the same instances" in text
    assert "longest_increasing_subsequence's own `solve` under a new prompt is rejected" in text
    assert text.rstrip().endswith("single ```python code block and nothing else.")


def test_a_file_without_a_sample_method_has_no_sample_code() -> None:
    assert sample_code("class A:\n    def solve(self, i):\n        return 1\n") is None
    assert sample_code("def broken(:\n") is None


def test_the_own_task_prompt_asks_for_the_task_on_the_first_line() -> None:
    text = user_text(own_task_messages([SORT, LIS]))
    assert "The FIRST line of your reply names the task: `Task: <the task in one sentence>`" in text
    assert "class SortWords" in text and "class LongestIncreasingSubsequence" in text
    assert "(sort_words, longest_increasing_subsequence)" in text
    # the topic prompt names no such line: the modes differ in what they ask
    assert "Task:" not in user_text(proposal_messages([SORT, LIS], "the median of a list"))


FILE = "from shared.environment import Environment\n\n\nclass Median(Environment):\n    pass\n"


@pytest.mark.parametrize(
    ("reply", "task"),
    [
        (
            f"Task: the median of a list of integers\n```python\n{FILE}```",
            "the median of a list of integers",
        ),
        (
            f"\n  **Task:** count the islands in a grid\n\n```python\n{FILE}```",
            "count the islands in a grid",
        ),
        (f"task - the k-th smallest value.\n```python\n{FILE}```", "the k-th smallest value."),
        (f"`Task: fewest coins`\n```python\n{FILE}```", "fewest coins"),
        (f"```python\n{FILE}```\nTask: too late", None),  # not the first line
        (f"Here is the file.\nTask: second line\n```python\n{FILE}```", None),
        ("", None),
    ],
)
def test_the_own_task_first_line_is_parsed_and_the_file_taken_as_written(
    reply: str, task: str | None
) -> None:
    assert own_task_of(reply) == task
    if FILE in reply:
        assert written_code(reply) == FILE  # the first line never enters the file


def test_an_unfenced_own_task_reply_keeps_its_task_line_out_of_the_file() -> None:
    reply = f"Task: the median of a list\n{FILE}"
    assert own_task_of(reply) == "the median of a list"
    assert written_code(reply) == FILE


def rejected(stage: str, detail: str, trigger: Trigger | None = None) -> ValidationReport:
    stages = [StageReport(stage="L1", ok=True, seconds=0.0, detail="ok")] if stage != "L1" else []
    stages.append(StageReport(stage=stage, ok=False, seconds=0.0, detail=detail, trigger=trigger))  # type: ignore[arg-type]
    return ValidationReport(
        file="c.py",
        name="median",
        verdict="rejected",
        failed_stage=stage,
        stages=stages,  # type: ignore[arg-type]
    )


def test_the_repair_prompt_holds_the_conversation_the_reply_and_the_failing_report() -> None:
    asked = proposal_messages([SORT], "the median of a list of integers")
    reply = f"```python\n{FILE}```"
    report = rejected(
        "L2",
        "sample raised KeyError: 'values' (seed 3, difficulty 5)",
        Trigger(seed=3, difficulty=5, answer="7"),
    )
    messages = repair_messages(asked, reply, report)
    assert messages[: len(asked)] == asked  # the proposal's conversation, unchanged
    assert messages[len(asked)] == {"role": "assistant", "content": reply}  # as the model wrote it
    turn = messages[-1]
    assert turn["role"] == "user" and len(messages) == len(asked) + 2
    text = turn["content"]
    assert "rejected this file at stage L2 (sample, solve, render and score run" in text
    assert "Reason: sample raised KeyError: 'values' (seed 3, difficulty 5)" in text
    assert "the instance of seed 3 at difficulty 5" in text
    assert "Answer text tried: '7'" in text
    assert text.rstrip().endswith("single ```python code block and nothing else.")


def test_a_long_report_is_cut_and_a_stage_without_trigger_says_none() -> None:
    text = failure_text(rejected("L1", "x" * 5000))
    assert "stage L1 (static checks of the file)" in text
    assert "seed" not in text and len(text) < 2200 and text.endswith(" ...")


def test_only_candidates_rejected_at_l1_to_l5_are_repaired() -> None:
    assert repairable(rejected("L4", "a constant answer passes"))
    assert not repairable(rejected("review", "a reviewer rejected it"))
    assert not repairable(rejected("calibration", "pass rate 0"))
    assert not repairable(None)
    error = ValidationReport(
        file="c.py", name=None, verdict="error", failed_stage=None, stages=[], error="sandbox"
    )
    assert not repairable(error)


def test_the_default_draw_is_topic_and_takes_nothing_from_the_rng() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert draw_mode({"topic": 1.0}, rng, can_repair=True) == "topic"
    assert rng.getstate() == state  # today's prompts draw the same examples and topics


def test_repair_is_drawn_only_with_a_group_to_repair_and_weights_set_the_mix() -> None:
    weights = {"topic": 1.0, "mutation": 1.0, "repair": 2.0, "own_task": 0.0}
    rng = random.Random(0)
    without = {draw_mode(weights, rng, can_repair=False) for _ in range(200)}  # type: ignore[arg-type]
    assert without == {"topic", "mutation"}
    drawn = [draw_mode(weights, rng, can_repair=True) for _ in range(2000)]  # type: ignore[arg-type]
    assert "own_task" not in drawn
    assert 0.45 < drawn.count("repair") / len(drawn) < 0.55
