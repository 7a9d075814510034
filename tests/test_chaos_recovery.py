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


def _at(t: float, log: str, text: str) -> dict[str, Any]:
    return {"_t": t, "_log": log, "event": text}


def _restarted(t: float, child: str) -> dict[str, Any]:
    return {"_t": t, "_log": "up", "event": "child_restarted", "child": child}


def test_a_killed_worker_idle_when_back_counts_its_restart_and_its_first_job() -> None:
    log = "worker-validation"
    events = [
        _restarted(30.0, log),
        _at(200.0, log, "Task evoenv.validate[job-9] received"),
        _at(250.0, log, "Task evoenv.validate[job-9] succeeded in 50.0s: {}"),
    ]
    fault = {"kind": "worker", "target": log, "at": 0.0}
    assert chaos.recovery(events, {**fault, "queued_at_back": 0}) == 80.0  # 30 back + 50 job
    # jobs were waiting when it came back (or Redis could not say): all of it is recovery
    assert chaos.recovery(events, {**fault, "queued_at_back": 2}) == 250.0
    assert chaos.recovery(events, fault) == 250.0


def test_after_vllm_any_job_of_the_generation_worker_counts() -> None:
    log = "worker-generation"
    events = [
        _restarted(60.0, "vllm"),
        _at(90.0, log, "Task evoenv.propose[p-1] succeeded in 400.0s: {}"),
        _at(120.0, log, "Task evoenv.complete[c-1] succeeded in 30.0s: {}"),
    ]
    assert chaos.recovery(events, {"kind": "vllm", "target": "vllm", "at": 0.0}) == 90.0


def test_the_learner_recovers_when_it_reads_the_stream_again() -> None:
    events = [
        {"_t": 5.0, "_log": "learner", "event": "group_read"},  # the killed one's, before
        _restarted(20.0, "learner"),
        {"_t": 70.0, "_log": "learner", "event": "group_read"},
        {"_t": 300.0, "_log": "learner", "event": "train_step"},
    ]
    fault = {"kind": "learner", "target": "learner", "at": 10.0}
    assert chaos.recovery(events, fault) == 60.0
    assert chaos.next_step(events, fault) == 290.0


def test_after_redis_the_first_job_completed_into_the_restarted_server_counts() -> None:
    log = "worker-grading"
    events = [
        _at(1.0, log, "Task evoenv.grade[g-1] received"),
        _at(12.0, log, "Task evoenv.grade[g-0] succeeded in 11.0s: {}"),  # before it was back
        _restarted(15.0, "redis"),
        _at(40.0, log, "Task evoenv.grade[g-1] succeeded in 39.0s: {}"),  # its result went there
        _at(65.0, log, "Task evoenv.grade[g-2] succeeded in 15.0s: {}"),
    ]
    assert chaos.recovery(events, {"kind": "redis", "target": "redis", "at": 10.0}) == 30.0


def test_a_stopped_worker_replaced_by_up_counts_from_the_sigstop() -> None:
    log = "worker-grading"
    events = [
        _restarted(110.0, log),  # found silent and replaced, long before the SIGCONT
        _at(112.0, log, "Task evoenv.grade[g-1] received"),
        _at(130.0, log, "Task evoenv.grade[g-1] succeeded in 18.0s: {}"),
    ]
    fault = {"kind": "sigstop", "target": log, "at": 0.0, "resumed": 930.0, "queued_at_resume": 0}
    assert chaos.recovery(events, fault) == 130.0


def test_groups_graded_into_other_runs_than_the_trainers_are_not_lost(tmp_path: Path) -> None:
    def sampled(t: float, run: str, group: str) -> dict[str, Any]:
        text = (
            f"Task evoenv.sample[x] succeeded in 0.01s: {{'run': '{run}', 'group_id': '{group}'}}"
        )
        return _at(t, "worker-grading", text)

    def graded(t: float, group: str) -> dict[str, Any]:
        return {"_t": t, "_log": "worker-grading", "event": "group_graded", "group_id": group}

    events = [
        {"_t": 0.0, "_log": "learner", "event": "learner_started", "run": "main"},
        sampled(1.0, "main", "aa01"),
        sampled(1.0, "main-serving", "bb02"),
        sampled(1.0, "main-eval", "cc03"),
        sampled(1.0, "main", "dd04"),
        *(graded(2.0, g) for g in ("aa01", "bb02", "cc03", "dd04")),
        {
            "_t": 3.0,
            "_log": "learner",
            "event": "train_step",
            "step": 1,
            "groups_trained": ["aa01"],
        },
    ]
    found = chaos.analyse(events, [], set(), 10.0, tmp_path)
    assert found["lost"] == ["dd04"] and found["graded"] == 2
