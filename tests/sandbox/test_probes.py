"""Hidden probes and re-scores of solver grading calls (`grade.grade_group`): for honest
environments (the seeds) they change neither the rewards nor the prompt and mark nothing; a
scorer that reads its frames, recognises validation seeds or holds a lottery is marked
`dishonest` in its grading call, and one honest only when graded alone by a re-score."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evoenv_worker.grade import grade_group, place_probes
from evoenv_worker.sandbox.host import Sandbox
from shared.config import Settings
from shared.db import source_sha
from shared.messages import CompletionRecord, EnvRef, SolverJob
from shared.static import check_static

REPO = Path(__file__).resolve().parents[2]
SEEDS = sorted((REPO / "seeds").glob("*.py"))
DISHONEST = REPO / "tests" / "corpus" / "dishonest"
PROBED = Settings(pool={"probe_rate": 1.0, "rescore_rate": 1.0})
PLAIN = Settings(pool={"probe_rate": 0.0, "rescore_rate": 0.0})


def job(path: Path, seed: int, difficulty: int, texts: list[str]) -> SolverJob:
    source = path.read_text()
    name = check_static(source.encode(), 64 * 1024).name or path.stem
    return SolverJob(
        run="probes",
        group_id=f"{path.stem}-{seed}-{difficulty}",
        env=EnvRef(name=name, sha=source_sha(source), source=source),
        seed=seed,
        difficulty=difficulty,
        group_size=len(texts),
        prompt="the prompt the solver saw",
        completions=[CompletionRecord(text=text) for text in texts],
    )


def answer_text(sandbox: Sandbox, path: Path, seed: int, difficulty: int) -> str:
    (made,) = sandbox.run(
        path.read_text(), [{"op": "instance", "seed": seed, "difficulty": difficulty}]
    )
    assert made.ok, made.error
    return str(made.value["answer_text"])


def test_probes_sit_anywhere_and_leave_the_answers_in_their_order() -> None:
    draws = random.Random(7)
    answers = ["a", None, "b", "c"]
    seen: dict[str, set[int]] = {"reference": set(), "empty": set(), "perturbed": set()}
    for _ in range(300):
        asked, probes = place_probes(answers, ("reference", "empty", "perturbed"), draws)
        assert sorted(probes.values()) == ["empty", "perturbed", "reference"]
        assert [a for k, a in enumerate(asked) if k not in probes] == answers
        assert all(asked[k] == {"probe": kind} for k, kind in probes.items())
        for position, kind in probes.items():
            seen[kind].add(position)
    assert all(positions == set(range(7)) for positions in seen.values())


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_probes_and_re_scores_change_nothing_for_an_honest_environment(
    sandbox: Sandbox, path: Path
) -> None:
    low, high = check_static(path.read_bytes(), 64 * 1024).difficulties
    for seed, difficulty in ((11, low), (12, (low + high) // 2), (13, high)):
        right = answer_text(sandbox, path, seed, difficulty)
        texts = [f"<answer>{right}</answer>", "<answer>0</answer>", "no span", "<answer></answer>"]
        texts.append(f"<answer>{right}, 1</answer>")
        graded = job(path, seed, difficulty, texts)
        probed, plain = grade_group(sandbox, graded, PROBED), grade_group(sandbox, graded, PLAIN)
        assert probed.data.dishonest is None, probed.data.dishonest
        assert probed.completions == plain.completions
        assert probed.prompt == plain.prompt == "the prompt the solver saw"
        assert probed.completions[0].reward == 1.0


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        ("frames_batch_only.py", 103),
        ("validation_seed_recogniser.py", 103),  # not one of the seeds it knows
        ("lottery.py", 165),  # the first seed past 100 whose instance the lottery accepts all on
    ],
)
def test_a_dishonest_scorer_is_marked_by_the_probes_of_its_grading_call(
    sandbox: Sandbox, name: str, seed: int
) -> None:
    path = DISHONEST / name
    right = answer_text(sandbox, path, seed, 2)
    texts = [f"<answer>{right}</answer>"] * 3 + ["<answer>0</answer>"] * 5
    probes_only = Settings(pool={"probe_rate": 1.0, "rescore_rate": 0.0})
    group = grade_group(sandbox, job(path, seed, 2, texts), probes_only)
    assert group.data.dishonest is not None
    assert group.data.dishonest.startswith("a hidden probe: the "), group.data.dishonest
    assert grade_group(sandbox, job(path, seed, 2, texts), PLAIN).data.dishonest is None


def test_a_scorer_honest_only_alone_is_marked_by_a_re_score(sandbox: Sandbox) -> None:
    path = DISHONEST / "frames_batch_only.py"
    rescored = Settings(pool={"probe_rate": 0.0, "rescore_rate": 1.0})
    group = grade_group(sandbox, job(path, 5, 2, ["<answer>0</answer>"] * 8), rescored)
    assert [c.reward for c in group.completions] == [1.0] * 8  # what the grading call gave
    assert group.data.dishonest is not None
    assert group.data.dishonest.startswith("a re-score: answer "), group.data.dishonest
    assert "scored 1 in the group's grading call and 0 alone" in group.data.dishonest
