"""The chaos bench's recovery of a SIGSTOPped worker, read from synthetic log events."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import chaos  # noqa: E402


def _event(t: float, text: str) -> dict[str, Any]:
    return {"_t": t, "_log": "worker-validation", "event": text}


def _stop(queued: int | None) -> dict[str, Any]:
    return {
        "kind": "sigstop",
        "target": "worker-validation",
        "at": 0.0,
        "resumed": 480.0,
        "queued_at_resume": queued,
    }


EVENTS = [
    _event(100.0, "Task evoenv.validate[job-1] received"),
    _event(600.0, "Task evoenv.validate[job-2] received"),
    _event(660.0, "Task evoenv.validate[job-2] succeeded in 59.8s: {}"),
]


def test_an_idle_workers_recovery_leaves_out_its_wait_for_work() -> None:
    # nothing queued at the SIGCONT: the first job came at 600 s and took 60 s
    assert chaos.recovery(EVENTS, _stop(0)) == 60.0


def test_a_worker_with_work_waiting_counts_from_its_sigcont() -> None:
    # jobs were waiting (or Redis could not say): the 120 s before its receipt are recovery
    assert chaos.recovery(EVENTS, _stop(3)) == 180.0
    assert chaos.recovery(EVENTS, _stop(None)) == 180.0
    # a job in flight across the stop, finished after the SIGCONT, counts from the SIGCONT
    held = [*EVENTS[:1], _event(500.0, "Task evoenv.validate[job-1] succeeded in 400.0s: {}")]
    assert chaos.recovery(held, _stop(0)) == 20.0
