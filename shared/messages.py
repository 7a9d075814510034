"""Wire payloads: one pydantic model per message between processes, each with a schema version.

A message that does not match its model is rejected where it is received, with the reason.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Verdict = Literal["admitted", "rejected", "error"]
Stage = Literal["L1", "L2", "L3", "L4", "L5", "review", "calibration", "novelty"]
MECHANICAL_STAGES: tuple[Stage, ...] = ("L1", "L2", "L3", "L4", "L5")
MODEL_STAGES: tuple[Stage, ...] = ("review", "calibration", "novelty")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION


class Trigger(BaseModel):
    """The input that made a stage fail, so a person can reproduce it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = None
    difficulty: int | None = None
    answer: str | None = None


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


class ValidationReport(Message):
    """The report of `evoenv validate` for one file (CONTRACT.md section 3)."""

    file: str
    name: str | None
    verdict: Verdict
    failed_stage: Stage | None
    stages: list[StageReport]
    isolated: bool = True
    """False when the sandbox ran in the explicit unconfined mode: the code was NOT isolated."""
    error: str | None = None
    """Why the check itself could not run (verdict `error`)."""

    def public(self) -> dict[str, Any]:
        """The JSON line of `evoenv validate --json`."""
        data = self.model_dump(mode="json", exclude={"schema_version"})
        if data["error"] is None:
            del data["error"]
        return data
