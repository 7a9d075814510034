"""Every queue, stream and Redis key name of EvoEnv, in one place.

Keys are namespaced by `PREFIX`; per-run keys (the rollout stream, groups) also carry the run
name, so several runs can share one Redis.
"""

from __future__ import annotations

PREFIX = "evoenv"

# Celery queues, split by the resource a job needs (docs/DESIGN.md#queues-and-message-flow).
GENERATION_QUEUE = "generation"
"""Completions from vLLM: proposals, solver answers, reviews (I/O bound)."""
VALIDATION_QUEUE = "validation"
"""Admission of one candidate, ad-hoc validation of a user's file (sandbox CPU)."""
GRADING_QUEUE = "grading"
"""Sampling instances and scoring answers (sandbox CPU)."""
QUEUES = (GENERATION_QUEUE, VALIDATION_QUEUE, GRADING_QUEUE)

POLICY_VERSION = f"{PREFIX}:policy_version"
"""The learner's monotonic policy version (an integer string)."""

PAUSED_SECONDS = f"{PREFIX}:paused_seconds"
"""Seconds the model servers spent paused in pauses that ended (`shared.pauses`)."""
PAUSED_SINCE = f"{PREFIX}:paused_since"
"""When the pause in progress began (epoch seconds); absent while the servers generate."""
DEAD_LETTERS = f"{PREFIX}:dead_letters"
"""Hash: task id -> JSON record of a job that failed past its retry/redelivery limit."""
LAST_ERRORS = f"{PREFIX}:last_errors"
"""Hash: task id -> the last infrastructure error of a job being retried."""


def attempts(task_id: str) -> str:
    """Counter of deliveries (first run, redeliveries, retries) of one task id."""
    return f"{PREFIX}:attempts:{task_id}"


def rollout_stream(run: str) -> str:
    """Stream of graded groups of one run; the learner reads it with a consumer group."""
    return f"{PREFIX}:{run}:rollouts"


def group_seen(run: str, group_id: str) -> str:
    """Marker that a graded group was appended to the stream (its idempotency key)."""
    return f"{PREFIX}:{run}:group_seen:{group_id}"


def group_record(run: str, group_id: str) -> str:
    """Hash tracking the members of a multi-job group, with its deadline."""
    return f"{PREFIX}:{run}:group:{group_id}"


def candidate(run: str, job_id: str) -> str:
    """JSON of a candidate under admission: its job and its L1-L5 report."""
    return f"{PREFIX}:{run}:candidate:{job_id}"


def final_report(job_id: str) -> str:
    """The full validation report of a job that ran the model stages (for `--queue` waiters)."""
    return f"{PREFIX}:report:{job_id}"


def repetition(run: str) -> str:
    """List of recent generation groups' mean in-group similarity (gamma's input)."""
    return f"{PREFIX}:{run}:repetition"


def generation_count(run: str) -> str:
    """Counter of the generation groups finalised in a run: each one's row in the archive's
    metrics (kind `generation`) is numbered by it."""
    return f"{PREFIX}:{run}:generation_count"
