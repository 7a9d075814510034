"""The second solve (evoenv_worker/second_solve.py) in the real sandbox, with written solves
scripted in place of the model: a file whose prompt asks what its `solve` computes passes with
a right reply and fails with a wrong one; a file whose prompt asks something else fails with the
reply that answers its prompt; a reply without `solve`, or with what L1 forbids, agrees on
nothing. The model's own written solves are measured by bench/bench_second_solve.py."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import started_sandbox

from evoenv_worker.context import WorkerContext
from evoenv_worker.model_stages import review_stage, trace_instance
from evoenv_worker.sandbox.host import Sandbox
from evoenv_worker.second_solve import second_solve, shape
from evoenv_worker.verdict import stage_job_for
from shared.config import Settings
from shared.inference import Completion, Sampling
from shared.messages import CandidateRef, CompletionRecord, EnvRef, StageJob, ValidateJob

CORPUS = Path(__file__).resolve().parent / "corpus"
SOUND = CORPUS / "sound" / "int_score_count_distinct.py"
UNSOUND = CORPUS / "unsound" / "ones_asked_row_product_solved.py"

COUNT_DISTINCT = "```python\ndef solve(instance):\n    return len(set(instance['numbers']))\n```"
COUNT_ALL = "```python\ndef solve(instance):\n    return len(instance['numbers'])\n```"
COUNT_ONES = (
    "Count every 1.\n```python\nimport itertools\n\n\ndef ones(rows):\n"
    "    return sum(itertools.chain.from_iterable(rows))\n\n\n"
    "def solve(instance):\n    return ones(instance['cells'])\n```"
)
NO_SOLVE = "```python\ndef answer(instance):\n    return 3\n```"
FORBIDDEN = (
    "```python\nimport os\n\n\ndef solve(instance):\n"
    "    return len(set(instance['numbers'])) + len(os.sep) - 1\n```"
)


class Scripted:
    """An inference client that replies with fixed texts and keeps what it was asked."""

    def __init__(self, *replies: str) -> None:
        self.replies = replies
        self.asked: list[list[dict[str, str]]] = []

    def chat(self, messages: list[dict[str, str]], sampling: Sampling) -> list[Completion]:
        self.asked.append(messages)
        return [
            Completion(
                text=r,
                prompt_token_ids=[],
                token_ids=[],
                logprobs=[],
                finish_reason="stop",
                policy_version=0,
                version_source="redis",
                server="scripted",
            )
            for r in self.replies
        ]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    yield from started_sandbox(Settings().sandbox)


def check(sandbox: Sandbox, path: Path, *replies: str) -> tuple[bool, list[int], Scripted]:
    source = path.read_text()
    traced = trace_instance(sandbox, source, path.name)
    assert traced is not None
    meta, trace = traced
    client = Scripted(*replies)
    span = (int(meta["min_difficulty"]), int(meta["max_difficulty"]))
    result = second_solve(client, sandbox, source, path.name, trace, Sampling(n=3), span)  # type: ignore[arg-type]
    return result.ok, result.agreements, client


def test_a_right_second_solve_passes_a_sound_file_and_a_wrong_one_does_not(
    sandbox: Sandbox,
) -> None:
    ok, agreements, _ = check(sandbox, SOUND, COUNT_ALL, COUNT_DISTINCT)
    assert ok and agreements == [agreements[0], 9] and agreements[0] < 9
    ok, agreements, _ = check(sandbox, SOUND, COUNT_ALL)
    assert not ok


def test_a_file_whose_prompt_asks_something_else_fails_with_the_answer_to_its_prompt(
    sandbox: Sandbox,
) -> None:
    ok, agreements, _ = check(sandbox, UNSOUND, COUNT_ONES)
    assert not ok and agreements[0] < 3, agreements


def test_a_reply_without_solve_or_with_a_forbidden_import_agrees_on_nothing(
    sandbox: Sandbox,
) -> None:
    ok, agreements, _ = check(sandbox, SOUND, NO_SOLVE, FORBIDDEN)
    assert not ok and agreements == [0, 0]


def test_the_written_solve_is_asked_for_from_the_prompt_never_from_the_code(
    sandbox: Sandbox,
) -> None:
    _, _, client = check(sandbox, SOUND, COUNT_DISTINCT)
    (messages,) = client.asked
    text = "\n".join(m["content"] for m in messages)
    assert "How many different values occur in the list?" in text  # the rendered prompt
    assert '"numbers": [' in text and "as an int" in text  # the instance and the answer's form
    assert "def solve" not in text and "len(set(" not in text  # not the candidate's code


def test_the_answers_form_is_said_without_its_values() -> None:
    assert shape(7) == "an int"
    assert shape(["b", "a"]) == "a list of str"
    assert shape({"min": -3, "max": 4}) == 'a dict with the keys "min" (an int), "max" (an int)'
    assert shape([[1, 2]]) == "a list of list of int"


ACCEPT = (
    '{"data_flow": "ok", "trace": "ok", "algorithm": "ok", "scorer": "ok", '
    '"verdict": "accept", "bug": ""}'
)


class Reviewer(Scripted):
    """Accepts every review (constrained ones) and writes `written` as every second solve."""

    def __init__(self, written: str) -> None:
        super().__init__(written)
        self.written = written

    def chat(self, messages: list[dict[str, str]], sampling: Sampling) -> list[Completion]:
        self.replies = (ACCEPT if sampling.json_schema else self.written,) * sampling.n
        return super().chat(messages, sampling)


def review(
    sandbox: Sandbox,
    path: Path,
    written: str,
    second_solves: int,
    generated: bool = True,
    judged: str = "generated",
) -> tuple[Any, int]:
    source = path.read_text()
    traced = trace_instance(sandbox, source, path.name)
    assert traced is not None
    meta, trace = traced
    env = EnvRef(name=path.stem, sha=hashlib.sha256(source.encode()).hexdigest(), source=source)
    job = StageJob(
        job_id="j",
        run="r",
        env=env,
        oracle=meta["oracle"],
        difficulty=trace.difficulty,
        trace=trace,
        min_difficulty=meta["min_difficulty"],
        max_difficulty=meta["max_difficulty"],
        generated=generated,
    )
    base = Settings()
    update = {"second_solves": second_solves, "second_solves_for": judged}
    admission = base.admission.model_copy(update=update)
    settings = base.model_copy(update={"admission": admission})
    client = Reviewer(written)
    report = review_stage(client, job, settings, sandbox)  # type: ignore[arg-type]
    return report, len(client.asked)


def test_with_second_solves_on_the_review_rejects_what_every_review_accepted_when_none_agrees(
    sandbox: Sandbox,
) -> None:
    report, asked = review(sandbox, UNSOUND, COUNT_ONES, 2)
    assert not report.ok and asked == 2
    assert "agreed with solve on" in report.detail and "review 1: accepted" in report.detail
    second = report.data["second_solve"]
    assert second["instances"] == 9 and len(second["agreements"]) == 2
    assert max(second["agreements"]) < 9  # a chance agreement or two, never all
    report, _ = review(sandbox, SOUND, COUNT_DISTINCT, 2)
    assert report.ok and report.data["second_solve"]["agreements"] == [9, 9]
    report, asked = review(sandbox, UNSOUND, COUNT_ONES, 0)  # off: the reviews alone decide
    assert report.ok and asked == 1 and "second_solve" not in report.data


def test_by_default_second_solves_judge_generated_candidates_only(sandbox: Sandbox) -> None:
    report, asked = review(sandbox, UNSOUND, COUNT_ONES, 2, generated=False)
    assert report.ok and asked == 1 and "second_solve" not in report.data  # a person's file
    report, asked = review(sandbox, UNSOUND, COUNT_ONES, 2, generated=False, judged="all")
    assert not report.ok and asked == 2


def test_the_stage_job_says_whether_the_generator_wrote_the_file(sandbox: Sandbox) -> None:
    data = SOUND.read_bytes()
    ctx = WorkerContext(Settings(), _sandbox=sandbox)
    own = ValidateJob.for_file("own", SOUND.name, data)
    completion = CompletionRecord(text=data.decode())
    ref = CandidateRef(run="r", group_id="g", index=0, prompt="p", completion=completion)
    written = own.model_copy(update={"job_id": "written", "candidate": ref})
    jobs = [stage_job_for(ctx, job) for job in (own, written)]
    assert [job.generated for job in jobs if job is not None] == [False, True]
