"""How the learner expires a generation group, wired here because it joins the two sides: the
workers' `generation.expire_group`, run in the learner's process on the learner's Redis client
and archive (`evoenv_learner.loop.GroupExpiry`). Why not a job: see `group_expiry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.config import Settings

if TYPE_CHECKING:
    import redis

    from shared.db import Archive


def group_expiry(
    settings: Settings, client: redis.Redis, archive: Archive
) -> Callable[[str, str], bool]:
    """The orchestrator's `expire_group`: finalise the run's generation group GROUP_ID as
    expired for WHY; False if it completed first.

    Not a job: the learner decides at the deadline, atomically against a late completion,
    whether the group expired or completed first (and so whether its candidates count as
    expired), and it must decide even when no worker is running (a proposal that no worker
    took is what expires).
    """
    from evoenv_worker.context import WorkerContext
    from evoenv_worker.generation_groups import expire_group

    ctx = WorkerContext(settings, _redis=client, _archive=archive)
    return lambda group_id, why: expire_group(ctx, settings.run, group_id, why)
