"""What the learner keeps of each step for a person to read (evoenv_learner/samples.py): a few
completions taken from the step's groups in turn, each with its reward and outcome, the answer
beside the reference or the candidate's verdict; the archive keeps the last N steps, and
TensorBoard's text tab shows them."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evoenv_learner.metrics import MetricsSink
from evoenv_learner.samples import TEXT_CHARS, step_samples
from shared.config import Settings
from shared.db import Archive
from shared.messages import (
    GeneratorGroupData,
    GradedCompletion,
    GradedGroup,
    SolverGroupData,
)


def completion(text: str, reward: float | None, outcome: str = "scored") -> GradedCompletion:
    return GradedCompletion(text=text, reward=reward, outcome=outcome, policy_version=3)  # type: ignore[arg-type]


SOLVER = GradedGroup(
    run="r",
    group_id="s1",
    role="solver",
    env_name="sort_words",
    env_sha="a" * 64,
    seed=7,
    difficulty=2,
    prompt="Sort these words: b a",
    policy_version=3,
    completions=[
        completion("<answer>a b</answer>", 1.0),
        completion("<answer>b a</answer>", 0.0),
        completion("no span" + "x" * (2 * TEXT_CHARS), 0.0, "format_error"),
    ],
    data=SolverGroupData(reference="a b"),
)
GENERATOR = GradedGroup(
    run="r",
    group_id="g1",
    role="generator",
    env_name="proposal",
    env_sha="b" * 64,
    seed=0,
    difficulty=0,
    prompt="Write an environment",
    policy_version=2,
    completions=[completion("class A(Environment): ...", -0.9), completion("class B: ...", 2.1)],
    data=GeneratorGroupData(funnel=["L2", "admitted"], gamma=1.0),
)


def test_samples_take_the_groups_in_turn_with_answers_references_and_verdicts() -> None:
    samples = step_samples([SOLVER, GENERATOR], 3, 200)
    assert [(s["group_id"], s["role"]) for s in samples] == [
        ("s1", "solver"),
        ("g1", "generator"),
        ("s1", "solver"),
    ]
    right, candidate, wrong = samples
    assert (right["answer"], right["reference"], right["reward"], right["outcome"]) == (
        "a b",
        "a b",
        1.0,
        "scored",
    )
    assert (wrong["answer"], wrong["reward"]) == ("b a", 0.0)
    assert right["env"] == "sort_words" and right["difficulty"] == 2
    assert right["policy_version"] == 3 and right["prompt"] == SOLVER.prompt
    assert candidate["verdict"] == "L2" and candidate["job_id"] == "g1-0"
    assert candidate["text"].startswith("class A") and "answer" not in candidate
    every = step_samples([SOLVER, GENERATOR], 10, 200)
    assert [s["group_id"] for s in every] == ["s1", "g1", "s1", "g1", "s1"]
    assert every[3]["verdict"] == "admitted" and every[3]["reward"] == 2.1
    (unspanned,) = [s for s in every if s["outcome"] == "format_error"]
    assert unspanned["answer"] is None and len(unspanned["text"]) == TEXT_CHARS


def test_the_archive_keeps_the_last_steps_samples_and_tensorboard_shows_them(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'archive.db'}",
        learner={"samples_steps": 2, "samples_per_step": 2},
    )
    archive = Archive(settings.archive_url)
    sink = MetricsSink(settings, archive, tmp_path / "tensorboard")
    for step in (1, 2, 3):
        sink.samples(step, step, [SOLVER, GENERATOR])
    sink.close()
    rows = archive.metrics(settings.run, "samples")
    assert [row.step for row in rows] == [2, 3]
    assert rows[-1].values["samples"][0]["reference"] == "a b"
    assert archive.runs_with("samples") == [settings.run]

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("samples/text_summary")
    assert [event.step for event in texts] == [1, 2, 3]
    shown = texts[-1].tensor_proto.string_val[0].decode()
    assert "step 3: 2 samples" in shown and "reference `a b`" in shown and "verdict L2" in shown
