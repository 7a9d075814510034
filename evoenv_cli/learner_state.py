"""The learner's state as a file beside its run, RUN/learner-state.json: `evoenv learner` writes
it when it starts, after each step and when it is asked to stop; `evoenv up`, whose learner is a
child process, reads it for its display (`LearnerView`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "learner-state.json"


def state_path(run_dir: Path) -> Path:
    return run_dir / STATE_FILE


def write_state(path: Path, state: Any) -> None:
    """Write the learner's `state` (a `loop.LearnerState`) to `path`, atomically (a reader sees
    the old file or the new one, never half of one)."""
    data = {
        "pid": os.getpid(),
        "step": state.step,
        "version": state.version,
        "stale_dropped": state.stale_dropped,
        "skipped_groups": state.skipped_groups,
        "funnel": state.funnel,
        "last_metrics": state.last_metrics,
        "stopping": state.stopping,
        "tokens": state.tokens,
        "in_flight": state.in_flight(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


@dataclass(frozen=True)
class LearnerView:
    """The learner's state as read from its file: what `Display` shows (the attributes of a
    `loop.LearnerState` it reads)."""

    pid: int = 0
    step: int = 0
    version: int = 0
    stale_dropped: int = 0
    skipped_groups: int = 0
    funnel: dict[str, int] = field(default_factory=dict)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    stopping: bool = False
    tokens: int = 0
    in_flight_groups: int = 0

    def in_flight(self) -> int:
        return self.in_flight_groups

    @property
    def judged(self) -> int:
        """Generated candidates that reached an admission verdict (as `LearnerState.judged`)."""
        return sum(count for outcome, count in self.funnel.items() if outcome != "expired")


def read_state(path: Path) -> LearnerView | None:
    """The learner's state in `path`; None when there is none yet (or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return LearnerView(
        pid=int(data.get("pid", 0)),
        step=int(data.get("step", 0)),
        version=int(data.get("version", 0)),
        stale_dropped=int(data.get("stale_dropped", 0)),
        skipped_groups=int(data.get("skipped_groups", 0)),
        funnel={str(k): int(v) for k, v in dict(data.get("funnel", {})).items()},
        last_metrics=dict(data.get("last_metrics", {})),
        stopping=bool(data.get("stopping", False)),
        tokens=int(data.get("tokens", 0)),
        in_flight_groups=int(data.get("in_flight", 0)),
    )
