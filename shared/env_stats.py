"""An environment's stats in the archive: one typed model, `EnvStats`, in place of a free dict;
every write and read of the archive's `stats` column goes through it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import FunnelOutcome
from shared.rewards import RewardParts

ArchivedFunnel = FunnelOutcome | Literal["expired", "name clash"]
"""A generated candidate's outcome as the archive keeps it: its generation group's
(`FunnelOutcome`), `expired` (its group expired first) or `name clash` (every stage passed,
but an active environment already has its name)."""


class _Stats(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CalibrationFigures(_Stats):
    """The calibration stage's figures at admission, as its report had them (a stage that
    could not run has none of them, or only `error`)."""

    pass_rate: float | None = None
    """a: the share of the m instances the solver passed (reward exactly 1.0)."""
    passes: int | None = None
    instances: int | None = None
    """m: the fresh instances the solver answered."""
    difficulty: int | None = None
    """The calibration difficulty."""
    env_errors: int | None = None
    """Answers the environment's scorer failed on."""
    quality: float | None = None
    """Q of a: the generator reward's calibration quality."""
    error: bool | None = None
    """True when the stage could not run."""


class NoveltyFigures(_Stats):
    """The novelty stage's figures at admission (its embeddings are kept apart, in the row's
    `embedding`)."""

    similarity: float | None = None
    """The maximum similarity to a pool member (1.0 for a copy)."""
    nearest: str | None = None
    """The name of that member (None: the pool was empty)."""
    same_oracle: str | None = None
    """The member whose reference it reproduces under another prompt, if any."""
    error: bool | None = None
    """True when the stage could not run."""


class Served(_Stats):
    """The solver's graded answers at one difficulty."""

    scored: int
    """Answers graded other than env_error."""
    passes: int
    """Of those, the ones that scored exactly 1.0."""


class DifficultySearch(_Stats):
    """One serving-difficulty search (`evoenv_learner/difficulty.py`)."""

    at: str
    """When (ISO 8601, UTC)."""
    level: int
    """The level it chose."""
    curve: dict[str, float]
    """{level: pass rate} it measured."""


class Retirement(_Stats):
    """Why and when an environment left the pool for good."""

    reason: str
    """`rotation`, `superseded seed`, or the reason `evoenv pool retire` was given."""
    at: str
    """When (ISO 8601, UTC)."""
    epochs: int | None = None
    """Epochs of use at its rotation (rotation only)."""


class Quarantine(_Stats):
    """Why and when an environment was quarantined: too many env_error gradings, or its scorer
    disagreed with itself on a graded group (a hidden probe or a re-score)."""

    reason: str
    """`env_error rate`, or `dishonest: ` and what the grader saw."""
    gradings: int
    env_errors: int
    rate: float
    """env_errors / gradings when it was quarantined (0.0 before any grading)."""
    threshold: float
    """The env_error rate that quarantines (`pool.quarantine_error_rate`): the one an
    `env_error rate` quarantine went over."""
    at: str
    """When (ISO 8601, UTC)."""


class EnvStats(_Stats):
    """What the archive keeps of an environment besides its source and status. The archive's
    `stats` column (`shared/db.py`) holds `EnvStats.to_json()` and is read back through
    `EnvStats.from_json`. Who sets which fields:

        admission   judged_at, admitted_at, calibration, calibration_difficulty, novelty
                    (`evoenv_worker/verdict.py`); a generated candidate also reward, funnel
                    and expired (`evoenv_worker/generation_groups.py`)
        the pool    uses, epochs, gradings, env_errors, served, recent_groups,
                    serving_difficulty, serving_curve, pass_rate_history, retired, quarantine
                    (`evoenv_learner/pool.py`)

    The JSON holds the fields that were set (given, read, assigned, or changed in place) and
    nothing for the others: the very dict archive schema version 1 stored, so a row written by
    version 1 reads into the model as it is, and one written back reads the same to version 1.
    A key no version wrote is refused where the row is read (`extra="forbid"`)."""

    judged_at: float | None = None
    """When admission judged it (Unix seconds)."""
    admitted_at: float | None = None
    """When it was admitted (Unix seconds); reports count an environment admitted by it, even
    after it retired."""
    calibration: CalibrationFigures | None = None
    calibration_difficulty: int | None = None
    """The difficulty calibration ran at: where the solver is served before any search."""
    novelty: NoveltyFigures | None = None
    reward: RewardParts | None = None
    """A generated candidate's generator reward and its parts (None: its group expired)."""
    funnel: ArchivedFunnel | None = None
    """A generated candidate's outcome."""
    expired: str | None = None
    """Why a generated candidate's generation group expired."""
    uses: int = 0
    """Instances served (one solver group is one instance)."""
    epochs: int = 0
    """Whole epochs of use: uses // `pool.epoch_instances`."""
    gradings: int = 0
    """Completions graded."""
    env_errors: int = 0
    """Of those, the ones graded env_error."""
    served: dict[str, Served] = Field(default_factory=dict)
    """Per difficulty (as text), when the caller reports the passes."""
    recent_groups: list[str] = Field(default_factory=list)
    """The last solver groups counted (oldest first), against counting a replayed one twice."""
    serving_difficulty: int | None = None
    """The level the solver is served at, once a search set it."""
    serving_curve: dict[str, float] | None = None
    """{level: pass rate} of the last serving-difficulty search."""
    pass_rate_history: list[DifficultySearch] = Field(default_factory=list)
    """The serving-difficulty searches, oldest first (the last 50)."""
    retired: Retirement | None = None
    quarantine: Quarantine | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any] | None) -> EnvStats:
        """The stats of an archive row (None, as a row may hold, reads as no stats)."""
        return cls.model_validate(stored or {})

    def to_json(self) -> dict[str, Any]:
        """What the archive stores: every field set (given, read, assigned, or changed in place
        from its default), and nothing for the others."""
        changed = {
            name
            for name, field in type(self).model_fields.items()
            if getattr(self, name) != field.get_default(call_default_factory=True)
        }
        shown = self.model_copy()
        shown.model_fields_set.update(changed)
        return shown.model_dump(mode="json", exclude_unset=True)

    def merged(self, update: EnvStats) -> EnvStats:
        """These stats with each field of `update`'s JSON (`to_json`) taking its value."""
        return EnvStats.from_json({**self.to_json(), **update.to_json()})
