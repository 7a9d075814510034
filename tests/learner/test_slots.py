"""Every group the orchestrator sends frees its slot, whatever becomes of it (pure: no
services). Generation groups: read (trained, skipped, dropped as stale or malformed), proposal
failed for good, or lost (past `learner.generation_deadline`). Solver groups: read, chain
failed, or lost (overdue). And staleness checked again at the step that would use a group."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from evoenv_learner import orchestrator as orchestrator_module
from evoenv_learner.consumer import Dropped
from evoenv_learner.loop import (
    LearnerState,
    _group_expiry,
    settle_dropped,
    settle_read,
    split_stale,
)
from evoenv_learner.orchestrator import Orchestrator
from evoenv_learner.pool import PoolEntry
from shared import pauses
from shared.config import Settings
from shared.messages import (
    GeneratorGroupData,
    GradedCompletion,
    GradedGroup,
    ProposalJob,
    SolverGroupData,
)

pytestmark = pytest.mark.timeout(30)
SEED = Path(__file__).resolve().parents[2] / "seeds" / "sort_words.py"
ENTRY = PoolEntry(
    sha="s", name="sort_words", source=SEED.read_text(), origin="seed", difficulty=None
)


async def no_backlog() -> int:
    return 0


class Result:
    """A Celery AsyncResult: pending, or ended (failed or not)."""

    def __init__(self, *, ready: bool = False, failed: bool = False) -> None:
        self._ready, self._failed = ready, failed
        self.result = RuntimeError("dead-lettered after 9 deliveries") if failed else None

    def ready(self) -> bool:
        return self._ready

    def failed(self) -> bool:
        return self._failed


class OnePool:
    def __init__(self) -> None:
        self.members = [ENTRY]

    def __contains__(self, sha: str) -> bool:
        return False

    def quarantined(self, sha: str) -> bool:
        return False

    def record_use(self, sha: str) -> None:
        pass


def orchestrator(
    learner: dict[str, Any] | None = None, *, expired: bool = True, **settings: Any
) -> tuple[Orchestrator, list[str], list[tuple[str, str]]]:
    """An orchestrator that sends one generation group at a time (no solver groups); the
    proposals it sends and the groups it asks to expire are recorded."""
    learner = {"solver_groups_in_flight": 0, "generator_groups_in_flight": 1, **(learner or {})}
    calls: list[tuple[str, str]] = []

    def expire(group_id: str, why: str) -> bool:
        calls.append((group_id, why))
        return expired

    o = Orchestrator(
        Settings(learner=learner, grpo={"group_size": 4}, **settings),
        pool=OnePool(),  # type: ignore[arg-type]
        backlog=no_backlog,
        expire_group=expire,
    )
    return o, [], calls


def sending(o: Orchestrator, sent: list[str], result: Result) -> None:
    def send_proposal(job: ProposalJob) -> Result:
        sent.append(job.group_id)
        return result

    o.proposals.send_proposal = send_proposal  # type: ignore[method-assign]


async def run_for(o: Orchestrator, seconds: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(o.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrator_module, "SEND_POLL_SECONDS", 0.01)


def group(role: str, rewards: list[float], *, version: int = 0, gid: str = "g") -> GradedGroup:
    completions = [
        GradedCompletion(
            text="x",
            token_ids=[1],
            logprobs=[-0.1],
            policy_version=version,
            reward=r,
            outcome="scored",
        )
        for r in rewards
    ]
    return GradedGroup(
        run="r",
        group_id=gid,
        role=role,  # type: ignore[arg-type]
        env_name="e",
        env_sha="s",
        seed=0,
        difficulty=1,
        prompt="p",
        policy_version=version,
        completions=completions,
        data=(
            GeneratorGroupData(funnel=["L1", "admitted"] * (len(rewards) // 2), gamma=1.0)
            if role == "generator"
            else SolverGroupData()
        ),
    )


# ------------------------------------------------------------------ generation groups, read


@pytest.mark.parametrize(("rewards", "trained"), [([-1.0, 1.3], True), ([-1.0, -1.0], False)])
def test_a_generation_group_read_frees_its_slot_trained_or_skipped(
    rewards: list[float], trained: bool
) -> None:
    o, _, _ = orchestrator()
    o.generator_in_flight["g"] = Result()
    assert o.groups_in_flight() == 1
    state = LearnerState()
    queued = asyncio.run(settle_read(group("generator", rewards), o, OnePool(), state, o.settings))  # type: ignore[arg-type]
    assert queued is trained
    assert o.generator_in_flight == {}
    assert state.funnel == {"L1": 1, "admitted": 1}
    assert state.skipped_groups == (0 if trained else 1)
    assert state.tokens == 2 and state.judged == 2  # one token per completion; two verdicts
    assert o.groups_in_flight() == 0


@pytest.mark.parametrize("why", ["stale", "malformed"])
def test_a_generation_group_dropped_where_read_frees_its_slot(why: str) -> None:
    o, _, _ = orchestrator()
    o.generator_in_flight["g"] = Result()
    funnel: dict[str, int] = {}
    outcomes = ("L3", "admitted") if why == "stale" else ()
    settle_dropped([Dropped("g", "generator", why, outcomes)], o, funnel)
    assert o.generator_in_flight == {}
    assert funnel == ({"L3": 1, "admitted": 1} if why == "stale" else {})


# ------------------------------------------------------- generation groups that cannot arrive


def test_a_failed_proposal_frees_its_slot_expires_and_the_next_is_sent() -> None:
    o, sent, expired = orchestrator()
    sending(o, sent, Result(ready=True, failed=True))
    with capture_logs() as logs:
        asyncio.run(run_for(o, 0.2))
    assert len(sent) >= 2, "a proposal failed for good must not stop generation"
    assert expired and expired[0][0] == sent[0]
    assert "proposal failed" in expired[0][1] and "dead-lettered" in expired[0][1]
    assert o.funnel["expired"] == 4 * len(expired)  # G candidates each
    assert any(e["event"] == "generation_group_expired" for e in logs)
    assert len(o.generator_in_flight) <= 1


def test_a_lost_generation_group_expires_at_its_deadline_and_the_next_is_sent() -> None:
    o, sent, expired = orchestrator({"generation_deadline": 0.05})
    sending(o, sent, Result())  # its proposal ran (or was lost): the group never arrives
    with capture_logs() as logs:
        asyncio.run(run_for(o, 0.03))
        assert (len(sent), expired) == (1, []), "not before its deadline"
        asyncio.run(run_for(o, 0.3))
    assert len(sent) >= 2
    assert expired[0][0] == sent[0] and "0.05 s" in expired[0][1]
    assert o.funnel["expired"] == 4 * len(expired)
    warnings = [e for e in logs if e["event"] == "generation_group_expired"]
    assert warnings and warnings[0]["log_level"] == "warning"


def test_a_group_that_completed_meanwhile_is_not_counted_expired() -> None:
    o, sent, expired = orchestrator({"generation_deadline": 0.01}, expired=False)
    sending(o, sent, Result())
    asyncio.run(run_for(o, 0.1))
    assert expired and len(sent) >= 2  # its slot is freed all the same
    assert "expired" not in o.funnel  # its own funnel counts when it is read


@pytest.mark.parametrize("learner", [{}, {"synchronous": True}, {"generator_groups_in_flight": 0}])
def test_a_learner_without_the_group_expiry_says_so_once_if_it_sends_generation_groups(
    learner: dict[str, Any],
) -> None:
    """`python -m evoenv_learner` has no `expire_group`: only the slot of a lost group is freed."""
    settings = Settings(learner=learner)
    with capture_logs() as logs:
        assert _group_expiry(settings, None, None, None) is None  # type: ignore[arg-type]
    warned = [e for e in logs if e["event"] == "group_expiry_missing"]
    sends = not learner
    assert len(warned) == sends
    if sends:
        assert warned[0]["log_level"] == "warning" and "slot freed" in warned[0]["detail"]


def test_the_group_expiry_handed_in_is_the_orchestrators() -> None:
    def expire(group_id: str, why: str) -> bool:
        return True

    with capture_logs() as logs:
        got = _group_expiry(Settings(), lambda *_: expire, None, None)  # type: ignore[arg-type]
    assert got is expire and logs == []


# ------------------------------------------------------------------------------ solver groups


def test_a_solver_group_read_or_dropped_settles_its_synchronous_round() -> None:
    o, _, _ = orchestrator({"synchronous": True})
    o.round_pending.update({"t", "s", "d"})
    state = LearnerState()
    trained = group("solver", [0.0, 1.0], gid="t")
    skipped = group("solver", [0.0, 0.0], gid="s")
    for g, expected in ((trained, True), (skipped, False)):
        assert asyncio.run(settle_read(g, o, OnePool(), state, o.settings)) is expected  # type: ignore[arg-type]
    settle_dropped([Dropped("d", "solver", "stale")], o, state.funnel)
    assert o.round_pending == set()
    assert o.round_trained == 1  # the skipped and the dropped ones are replaced


@pytest.mark.parametrize("how", ["failed", "lost"])
def test_a_solver_group_that_cannot_arrive_frees_its_slot(how: str) -> None:
    limits = {"complete_time_limit": 0.01, "grade_time_limit": 0.01}
    o, _, _ = orchestrator(worker=limits)
    o.solver_in_flight["c"] = Result(ready=True, failed=True) if how == "failed" else Result()
    o.solvers.sent_at["c"] = orchestrator_module.time.monotonic() - (0 if how == "failed" else 1.0)
    o.solvers.reap()
    assert o.solver_in_flight == {}


# ------------------------------------------------------------------------ staleness at step


def test_a_group_that_aged_while_queued_is_dropped_at_the_step() -> None:
    batch = [group("solver", [0.0, 1.0], version=v, gid=f"v{v}") for v in (1, 5, 6)]
    with capture_logs() as logs:
        fresh, stale = split_stale(batch, version=6, max_staleness=4, step=9)
    assert [g.group_id for g in fresh] == ["v5", "v6"]
    assert [g.group_id for g in stale] == ["v1"]
    (line,) = [e for e in logs if e["event"] == "rollout_stale_at_step"]
    assert (line["version"], line["step_version"], line["step"]) == (1, 6, 9)


def test_synchronous_mode_replaces_groups_dropped_at_the_step() -> None:
    o, _, _ = orchestrator({"synchronous": True})
    o.solvers.round_trained = 2
    o.dropped_at_step(1)
    assert o.round_trained == 1 and o._wake.is_set()


# ------------------------------------------------------------ paused servers stop the clock


def test_the_serving_clock_stands_still_while_the_servers_are_paused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = pauses.ServingClock(client)
    start = clock()
    pauses.began(client)
    time.sleep(0.3)
    assert pauses.paused_seconds(client) >= 0.3, "the pause in progress counts"
    assert clock() - start < 0.1
    pauses.began(client)  # a nested pause keeps the first one's start
    pauses.ended(client)
    pauses.ended(client)  # ending twice adds nothing
    paused = pauses.paused_seconds(client)
    assert 0.3 <= paused < 0.5
    time.sleep(0.2)
    assert 0.15 <= clock() - start < 0.35, "and runs again after it"
    assert pauses.paused_seconds(client) == paused


def test_a_generation_group_does_not_expire_while_the_servers_are_paused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    o, sent, expired = orchestrator({"generation_deadline": 0.1})
    o.proposals.clock = pauses.ServingClock(client)
    sending(o, sent, Result())  # the group never arrives
    pauses.began(client)
    asyncio.run(run_for(o, 0.5))
    assert (len(sent), expired) == (1, []), "five deadlines paused, and not expired"
    pauses.ended(client)
    asyncio.run(run_for(o, 0.5))
    assert expired and expired[0][0] == sent[0]
