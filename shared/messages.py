"""Wire payloads: one pydantic model per message between processes, each with a schema
version; a message that does not match its model, or whose version is outside
`OLDEST_READ_VERSION`..`SCHEMA_VERSION`, is rejected where it is received, with the reason."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 5
"""The version every message is written with:

    1  a graded group's `data` is a free dict
    2  it is typed: `SolverGroupData` or `GeneratorGroupData`, by the group's role
    3  a proposal job and a generation group's data carry the proposal mode (`topic` when
       read from an older version) and the group a repair is of
    4  a solver group's data says when a hidden probe or a re-score disagreed (`dishonest`)
    5  a solver group's data carries the reference's answer text (`reference`)

A version-1 message is read as it is: the other payloads did not change, and everything
version 1 put in a graded group's `data` fits its typed model (a stream entry whose data does
not is dropped as malformed, where it is read, with both versions in the log line)."""
OLDEST_READ_VERSION = 1
"""The oldest version a message is still read from."""

Verdict = Literal["admitted", "rejected", "error"]
Stage = Literal["L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty"]
MECHANICAL_STAGES: tuple[Stage, ...] = ("L1", "L2", "L3", "L4", "L5")
MODEL_STAGES: tuple[Stage, ...] = ("review", "calibration", "novelty")
FunnelOutcome = Literal[
    "L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty", "error", "admitted"
]
"""A generated candidate's admission outcome: the first stage it failed, `error` (its check
could not run), or `admitted`."""
ProposalMode = Literal["topic", "mutation", "repair", "own_task"]
"""How a generation group's prompt asks for environments (docs/DESIGN.md#proposal-modes)."""
PROPOSAL_MODES: tuple[ProposalMode, ...] = ("topic", "mutation", "repair", "own_task")


def version_problem(version: object) -> str | None:
    """Why a message of schema version `version` is not read (None: it is)."""
    if isinstance(version, int) and OLDEST_READ_VERSION <= version <= SCHEMA_VERSION:
        return None
    return (
        f"written with message schema version {version}; this EvoEnv reads versions "
        f"{OLDEST_READ_VERSION}-{SCHEMA_VERSION}: run the workers and the learner from the "
        "same EvoEnv version"
    )


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    """The version of the code that wrote the message."""

    @field_validator("schema_version")
    @classmethod
    def _readable(cls, version: int) -> int:
        problem = version_problem(version)
        if problem is not None:
            raise ValueError(problem)
        return version


def utf8_text(text: str) -> str:
    """`text` as valid UTF-8 text: each lone surrogate (an environment's exception message, a
    path's undecodable byte), which no UTF-8 message, file or database holds, as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Trigger(BaseModel):
    """The input that made a stage fail, so a person can reproduce it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = None
    difficulty: int | None = None
    answer: str | None = None

    @field_validator("answer")
    @classmethod
    def _text(cls, answer: str | None) -> str | None:
        return None if answer is None else utf8_text(answer)


class StageReport(BaseModel):
    """One admission stage: passed or not, how long it took, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Stage
    ok: bool
    seconds: float
    detail: str
    trigger: Trigger | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    """Stage-specific figures (pass rate, similarity, review verdicts...)."""

    @field_validator("detail")
    @classmethod
    def _text(cls, detail: str) -> str:
        return utf8_text(detail)


class ValidationReport(Message):
    """The report of `evoenv validate` for one file (docs/CONTRACT.md#verdicts-and-exit-codes)."""

    file: str
    name: str | None
    verdict: Verdict
    failed_stage: Stage | None
    stages: list[StageReport]
    isolated: bool = True
    """False when the sandbox ran in the explicit unconfined mode: the code was NOT isolated."""
    error: str | None = None
    """Why the check itself could not run (verdict `error`)."""

    @field_validator("file", "error")
    @classmethod
    def _text(cls, text: str | None) -> str | None:
        return None if text is None else utf8_text(text)

    def public(self) -> dict[str, Any]:
        """The JSON line of `evoenv validate --json`."""
        data = self.model_dump(mode="json", exclude={"schema_version"})
        if data["error"] is None:
            del data["error"]
        return data


# ------------------------------------------------------------------------ jobs and rollouts

Role = Literal["solver", "generator"]


class EnvRef(BaseModel):
    """An environment as jobs carry it: its source travels with the job (at most 64 KiB)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha: str
    """sha256 of the source: the environment's identity in the archive."""
    source: str


class CandidateRef(BaseModel):
    """Where a generated candidate comes from: its generation group and its completion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    group_id: str
    index: int
    """Position in its generation group (the in-group novelty check goes in this order)."""
    prompt: str
    """The proposal prompt (as text) the candidate answers."""
    completion: CompletionRecord
    parents: list[str] = Field(default_factory=list)
    """sha of the pool members shown as examples (lineage)."""


class ValidateJob(Message):
    """Validate one candidate (`validation` queue): L1-L5, then optionally the model stages."""

    job_id: str
    file: str
    source: str
    adhoc: bool = True
    """Ad-hoc validation of a user's file: never adds anything to the pool."""
    model_stages: bool = False
    """Also run review, calibration and novelty (as jobs on their own queues)."""
    add_to_pool: bool = False
    """`evoenv pool add`: admit the file into the pool if every stage passes."""
    candidate: CandidateRef | None = None
    """Set for candidates written by the generator."""
    raw_b64: str | None = None
    """The file's bytes (base64) when they are not UTF-8 text: L1 judges them, not `source`."""

    @field_validator("source")
    @classmethod
    def _without_byte_order_mark(cls, source: str) -> str:
        """The text L1-L5 judge: a leading byte-order mark removed, so that what is stored,
        hashed and run later (review, calibration, the pool) is that text too."""
        return source.removeprefix("\ufeff")

    @classmethod
    def for_file(cls, job_id: str, file: str, data: bytes, **fields: Any) -> ValidateJob:
        """A job for a file's bytes, keeping them exact when they are not UTF-8."""
        try:
            return cls(job_id=job_id, file=file, source=data.decode("utf-8"), **fields)
        except UnicodeDecodeError:
            raw = base64.b64encode(data).decode("ascii")
            return cls(
                job_id=job_id,
                file=file,
                source=data.decode("utf-8", "replace"),
                raw_b64=raw,
                **fields,
            )

    @property
    def data(self) -> bytes:
        """The bytes to validate."""
        return (
            base64.b64decode(self.raw_b64)
            if self.raw_b64 is not None
            else self.source.encode("utf-8")
        )


class CompletionRecord(BaseModel):
    """One completion, with what the trainer needs to use it without re-tokenising."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    prompt_token_ids: list[int] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    """Per-token log-probs of the distribution actually sampled from."""
    finish_reason: str | None = None
    policy_version: int = 0


class SolverJob(Message):
    """One solver group, as it flows along the chain sample -> complete -> grade."""

    run: str
    group_id: str
    env: EnvRef
    seed: int
    difficulty: int
    group_size: int = Field(8, ge=1)
    prompt: str | None = None
    """Filled by `sample`: the full prompt (rendered problem + answer instruction)."""
    completions: list[CompletionRecord] = Field(default_factory=list)
    """Filled by `complete`."""
    temperature: float = 1.0
    max_tokens: int = 512
    error: str | None = None
    """Set when the environment failed to sample: the group is reported as an env_error."""
    prompt_budget: int | None = None
    """Longest prompt served, in tokens (estimated); longer ones are not served."""
    over_budget: bool = False
    """Set by `sample` when the prompt was over budget: no completions, no training."""
    lenient: bool = False
    """Also score each answer taken leniently (`extract_lenient`): the held-out evaluation's
    content measure, returned by the `grade` job beside the rewards, never trained on."""


class GradedCompletion(CompletionRecord):
    reward: float | None
    """None exactly when the outcome is env_error (left out of training)."""
    outcome: Literal["scored", "format_error", "env_error"]
    detail: str = ""


REFERENCE_CHARS = 2000
"""Most characters of a reference's answer text a solver group carries."""


class SolverGroupData(BaseModel):
    """What a solver group carries beside its completions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    over_budget: bool = False
    """Its prompt was over the prompt budget: nothing was sampled (no completions), and the
    orchestrator serves the environment one level easier."""
    env_error: str | None = None
    """Why the instance could not be made or graded (every completion is then env_error)."""
    dishonest: str | None = None
    """What the grader saw when the environment's scorer disagreed with itself on this
    instance: a hidden probe scored wrong, or an answer scored again alone got another reward
    (docs/CONTRACT.md#grades). The learner quarantines the environment and drops the group."""
    reference: str | None = None
    """The reference's answer text, as the solver is asked to write it (cut at
    `REFERENCE_CHARS`), for the learner's samples of what it trained on; None where the
    instance was not made."""


class GeneratorGroupData(BaseModel):
    """What a generation group carries beside its completions (one per candidate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    funnel: list[FunnelOutcome]
    """Each candidate's admission outcome, in candidate order."""
    gamma: float
    """The repetition factor the novelty bonus of its rewards was computed with."""
    parents: list[str] = Field(default_factory=list)
    """sha of the pool members the proposal prompt showed as examples."""
    mode: ProposalMode = "topic"
    """How its prompt asked for environments (`topic` for a group of an older version)."""
    repair_of: str | None = None
    """A repair group: the generation group whose failed candidates it repairs."""


class GradedGroup(Message):
    """One entry of the rollout stream: a group of completions for one prompt, graded."""

    run: str
    group_id: str
    role: Role
    env_name: str
    env_sha: str
    seed: int
    difficulty: int
    prompt: str
    policy_version: int
    """The oldest policy version among the completions: the group's age."""
    completions: list[GradedCompletion]
    data: SolverGroupData | GeneratorGroupData = Field(default_factory=SolverGroupData)
    """What its role carries beside the completions: `GeneratorGroupData` for a generator
    group, `SolverGroupData` for a solver group."""

    @model_validator(mode="after")
    def _data_of_its_role(self) -> GradedGroup:
        expected = GeneratorGroupData if self.role == "generator" else SolverGroupData
        if not isinstance(self.data, expected):
            raise ValueError(
                f"a {self.role} group's data is a {expected.__name__}, "
                f"got a {type(self.data).__name__}"
            )
        return self


class ConstantJob(Message):
    """Find the best constant answer of an environment on some instances (`grading` queue)."""

    env: EnvRef
    seeds: list[int]
    difficulty: int
    answers: list[str] = Field(default_factory=list)
    """The policy's answers on those instances: more candidates for a feasibility oracle."""


class ConstantBaseline(Message):
    """A `ConstantJob`'s result (see `shared/baseline.py`). On failure (an instance could not
    be made again, the sandbox failed a whole op) `error` says why, and there is no answer,
    score or rewards."""

    oracle: str | None = None
    references: list[str] = Field(default_factory=list)
    """Per seed, in the job's order: the reference answer text, stripped."""
    answer: str | None = None
    """The best constant answer; None only on failure."""
    score: float | None = None
    """Share of the instances the best constant passes (reward exactly 1.0)."""
    rewards: list[float] = Field(default_factory=list)
    """Per seed: the best constant's reward (0.0 where its scorer failed)."""
    error: str | None = None


class DeadLetter(Message):
    """A job that failed past its retry or redelivery limit."""

    task_id: str
    task: str
    attempts: int
    error: str
    payload: dict[str, Any] = Field(default_factory=dict)


# ------------------------------------------------------------------------- admission stages


class Trace(BaseModel):
    """One real instance of a candidate, from the sandbox: what a reviewer traces."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int
    difficulty: int
    prompt: str
    reference: Any
    answer_text: str


class CalibrationProbe(BaseModel):
    """One calibration of a candidate at one level (the calibration search's record)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    difficulty: int
    passes: int
    instances: int


class StageJob(Message):
    """A model stage of one candidate (review, calibration or novelty)."""

    job_id: str
    """The candidate's validation job id: the stages report under it."""
    run: str
    env: EnvRef
    oracle: str
    difficulty: int
    """Calibration difficulty (the middle of the range unless configured)."""
    trace: Trace
    seeds: list[int] = Field(default_factory=list)
    """Calibration: the fresh seeds of the m instances."""
    prompts: list[str] = Field(default_factory=list)
    """Calibration: filled by the sampling step."""
    completions: list[CompletionRecord] = Field(default_factory=list)
    """Calibration: filled by the completion step, one per prompt."""
    min_difficulty: int | None = None
    max_difficulty: int | None = None
    """The environment's range: the calibration search stays inside it."""
    probes: list[CalibrationProbe] = Field(default_factory=list)
    """Calibration search: the levels calibrated before this job's, in order."""
    confirm: bool = False
    """Calibration search: this is the fresh calibration at the level the search found."""
    generated: bool = False
    """The candidate was written by the generator (its ValidateJob has a `candidate`)."""
    error: str | None = None


class ProposalJob(Message):
    """Ask the generator for G candidate environments (generation queue)."""

    run: str
    group_id: str
    messages: list[dict[str, str]]
    """The chat messages of the proposal prompt (a repair's are built by the worker: empty)."""
    parents: list[str] = Field(default_factory=list)
    group_size: int = Field(8, ge=1)
    temperature: float = 1.0
    max_tokens: int = 1536
    mode: ProposalMode = "topic"
    """How the prompt asks for environments (docs/DESIGN.md#proposal-modes)."""
    repair_of: str | None = None
    """Mode `repair`: the finished generation group whose candidates that failed L1-L5 get one
    more turn each, with their failing stage's report (at most `group_size` of them)."""

    @model_validator(mode="after")
    def _repair_names_its_group(self) -> ProposalJob:
        if (self.mode == "repair") != (self.repair_of is not None):
            raise ValueError("a repair job, and only a repair job, names the group it repairs")
        return self


ValidateJob.model_rebuild()
