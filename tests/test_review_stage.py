"""The review stage fails closed: K verdicts must come back (docs/CONTRACT.md#review).

The reviewer is a fake client. Fewer than K completions (a server that returned fewer
choices than asked, or none) reject the candidate, as a reject or an unreadable verdict does;
a request that fails makes the stage one that could not run, so the verdict is `error`: in no
case is the candidate admitted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from evoenv_worker import verdict
from evoenv_worker.model_stages import review_stage
from shared.config import Settings
from shared.inference import Completion, InferenceError
from shared.messages import (
    MECHANICAL_STAGES,
    EnvRef,
    StageJob,
    StageReport,
    Trace,
    ValidateJob,
    ValidationReport,
)

K = 3
ACCEPT = '{"data_flow": "ok", "trace": "ok", "algorithm": "ok", "scorer": "ok", "verdict": "accept", "bug": ""}'


@dataclass(frozen=True, slots=True)
class Reply:
    text: str


@dataclass
class FakeReviewer:
    """Answers every review request with `replies`, or raises `error`."""

    replies: list[str]
    error: Exception | None = None
    asked: list[int] = field(default_factory=list)

    def chat(self, messages: list[dict[str, str]], sampling: Any) -> list[Reply]:
        self.asked.append(sampling.n)
        if self.error is not None:
            raise self.error
        return [Reply(text) for text in self.replies]


@pytest.fixture
def settings() -> Settings:
    base = Settings()
    return base.model_copy(update={"admission": base.admission.model_copy(update={"reviews": K})})


def _job() -> StageJob:
    trace = Trace(seed=0, difficulty=5, prompt="How many?", reference=3, answer_text="3")
    env = EnvRef(name="count", sha="0" * 64, source="class Count: ...")
    return StageJob(job_id="job", run="run", env=env, oracle="equality", difficulty=5, trace=trace)


@pytest.mark.parametrize("returned", [K, K + 1])
def test_k_accepting_verdicts_pass(returned: int, settings: Settings) -> None:
    reviewer = FakeReviewer([ACCEPT] * returned)
    report = review_stage(reviewer, _job(), settings)  # type: ignore[arg-type]
    assert reviewer.asked == [K]
    assert report.ok, report.detail


@pytest.mark.parametrize("returned", range(K))
def test_fewer_than_k_verdicts_reject(returned: int, settings: Settings) -> None:
    report = review_stage(FakeReviewer([ACCEPT] * returned), _job(), settings)  # type: ignore[arg-type]
    assert not report.ok, report.detail
    assert report.detail.count("no verdict came back") == K - returned, report.detail
    assert report.data["reviews"] == K and len(report.data["verdicts"]) == returned


class FakeContext:
    """What `verdict.run_locally` asks of a worker context for the review stage alone."""

    def __init__(self, settings: Settings, reviewer: FakeReviewer) -> None:
        self.settings = settings
        self._reviewer = reviewer

    def reviewer(self) -> FakeReviewer:
        return self._reviewer


def _judged(
    settings: Settings, reviewer: FakeReviewer, monkeypatch: pytest.MonkeyPatch
) -> ValidationReport:
    """The verdict of `validate --review` on a file that passed L1-L5."""
    monkeypatch.setattr(verdict, "stage_job_for", lambda ctx, job: _job())
    mechanical = ValidationReport(
        file="count.py",
        name="count",
        verdict="admitted",
        failed_stage=None,
        stages=[StageReport(stage=s, ok=True, seconds=0.0, detail="ok") for s in MECHANICAL_STAGES],
    )
    job = ValidateJob.for_file("job", "count.py", b"class Count: ...")
    context: Any = FakeContext(settings, reviewer)
    return verdict.run_locally(context, job, mechanical, ["review"])


@pytest.mark.parametrize(
    ("reviewer", "verdict", "failed_stage"),
    [
        (FakeReviewer([ACCEPT] * K), "admitted", None),
        (FakeReviewer([ACCEPT] * (K - 1)), "rejected", "review"),
        (FakeReviewer([ACCEPT, ACCEPT, "no verdict here"]), "rejected", "review"),
        (FakeReviewer([], error=InferenceError("the server answered 400")), "error", None),
    ],
    ids=["k-accepts", "one-missing", "one-unreadable", "request-failed"],
)
def test_a_candidate_is_admitted_only_with_k_accepting_verdicts(
    reviewer: FakeReviewer,
    verdict: str,
    failed_stage: str | None,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = _judged(settings, reviewer, monkeypatch)
    assert (report.verdict, report.failed_stage) == (verdict, failed_stage), report.stages[-1]


def _seeded(settings: Settings, seed: int | None) -> Settings:
    admission_settings = settings.admission.model_copy(update={"sampling_seed": seed})
    return settings.model_copy(update={"admission": admission_settings})


@dataclass
class RecordingClient:
    """Answers every request with one reply, recording each request's sampling seed."""

    seeds: list[int | None] = field(default_factory=list)

    def chat(self, messages: list[dict[str, str]], sampling: Any) -> list[Completion]:
        self.seeds.append(sampling.seed)
        reply = Completion(
            text=ACCEPT,
            prompt_token_ids=[1],
            token_ids=[2],
            logprobs=[-0.1],
            finish_reason="stop",
            policy_version=0,
            version_source="redis",
            server="fake",
        )
        return [reply] * sampling.n


def test_a_sampling_seed_makes_every_model_stage_request_repeatable(settings: Settings) -> None:
    from evoenv_worker.model_stages import calibration_complete

    job = _job().model_copy(update={"prompts": ["p1", "p2", "p3"], "seeds": [1, 2, 3]})
    runs = []
    for _ in range(2):
        client = RecordingClient()
        review_stage(client, job, _seeded(settings, 7))  # type: ignore[arg-type]
        calibration_complete(client, job, _seeded(settings, 7))  # type: ignore[arg-type]
        runs.append(client.seeds)
    first = runs[0]
    assert runs[0] == runs[1] and all(isinstance(s, int) for s in first)
    review, calibration = first[0], sorted(s for s in first[1:] if s is not None)
    assert len(set(calibration)) == 3 and review not in calibration  # a seed per request
    other = RecordingClient()
    review_stage(other, job, _seeded(settings, 8))  # type: ignore[arg-type]
    assert other.seeds[0] != review  # another seed, other samples
    unseeded = RecordingClient()
    review_stage(unseeded, job, _seeded(settings, None))  # type: ignore[arg-type]
    calibration_complete(unseeded, job, _seeded(settings, None))  # type: ignore[arg-type]
    assert unseeded.seeds == [None] * 4  # production: fresh randomness
