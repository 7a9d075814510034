"""The learner's side of the proposal modes (`Proposals.send`): the mode drawn, the prompt and
the job that carry it, repairs of groups read, and a repair group with nothing to repair
releasing its slot (pure: no services)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from evoenv_learner.levels import LevelTracker
from evoenv_learner.pool import PoolEntry
from evoenv_learner.proposals import Proposals
from shared.config import Settings
from shared.messages import ProposalJob
from shared.proposal_modes import mutation_messages, own_task_messages
from shared.proposal_prompt import TOPICS, Example, choose_examples, proposal_messages

SEEDS = Path(__file__).resolve().parents[2] / "seeds"
ENTRIES = [
    PoolEntry(
        sha=f"sha-{p.stem}", name=p.stem, source=p.read_text(), origin="seed", difficulty=None
    )
    for p in sorted(SEEDS.glob("*.py"))[:3]
]


class ThreeSeeds:
    members = ENTRIES


class Done:
    """A `propose` result that ended well, with the validation jobs it sent."""

    def __init__(self, sent: list[str]) -> None:
        self.result = sent

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return True

    def failed(self) -> bool:
        return False


def proposals(modes: dict[str, float], seed: int = 0) -> tuple[Proposals, list[ProposalJob]]:
    settings = Settings(learner={"proposal_modes": modes, "proposal_examples": 2})
    sent: list[ProposalJob] = []
    p = Proposals(settings, ThreeSeeds(), LevelTracker(settings), random.Random(seed))  # type: ignore[arg-type]

    def send_proposal(job: ProposalJob) -> Any:
        sent.append(job)
        return None  # pending

    p.send_proposal = send_proposal  # type: ignore[method-assign]
    return p, sent


def examples(p: Proposals) -> list[Example]:
    return [Example(m.name, p.tracker.info(m).oracle, m.source, m.sha) for m in ENTRIES]


def test_the_default_sends_todays_topic_prompt() -> None:
    p, sent = proposals({"topic": 1.0})
    p.send()
    rng = random.Random(0)  # what the prompt drew before modes existed, draw for draw
    chosen = choose_examples(examples(p), 2, rng)
    (job,) = sent
    assert job.mode == "topic" and job.repair_of is None
    assert job.messages == proposal_messages(chosen, rng.choice(TOPICS))
    assert job.parents == [e.sha for e in chosen] and p.modes[job.group_id] == "topic"


def test_mutation_and_own_task_send_their_prompts_and_record_their_mode() -> None:
    p, sent = proposals({"mutation": 1.0})
    p.send()
    (job,) = sent
    (member,) = [e for e in examples(p) if e.sha in job.parents]
    assert job.mode == "mutation" and job.messages == mutation_messages(member)
    assert p.modes == {job.group_id: "mutation"}

    p, sent = proposals({"own_task": 1.0})
    p.send()
    (job,) = sent
    by_sha = {e.sha: e for e in examples(p)}
    shown = [by_sha[sha] for sha in job.parents]
    assert len(shown) == 2 and job.mode == "own_task"
    assert job.messages == own_task_messages(shown)


def test_a_repair_takes_the_newest_group_read_once_and_never_a_repair_group() -> None:
    p, sent = proposals({"topic": 1.0, "repair": 1000.0})
    p.send()
    assert sent[-1].mode == "topic"  # nothing read yet: nothing to repair
    first = sent[-1].group_id
    p.done(first)
    p.send()
    repair = sent[-1]
    assert (repair.mode, repair.repair_of, repair.messages) == ("repair", first, [])
    assert p.modes[repair.group_id] == "repair"
    p.send()
    assert sent[-1].mode == "topic"  # each group is repaired once
    p.done(repair.group_id)  # a repair group read is not repaired again
    assert list(p.to_repair) == []


def test_a_repair_group_with_nothing_to_repair_frees_its_slot_without_expiring() -> None:
    expired: list[str] = []

    def expire(group_id: str, why: str) -> bool:
        expired.append(group_id)
        return True

    p, sent = proposals({"topic": 1.0, "repair": 1000.0})
    p.expire_group = expire
    p.send()
    p.done(sent[-1].group_id)
    p.send()
    repair = sent[-1].group_id
    p.in_flight[repair] = Done([])
    asyncio.run(p.expire_lost())
    assert repair not in p.in_flight and repair not in p.modes
    assert expired == [] and p.funnel == {}

    p.send()  # a topic group whose proposal sent its candidates waits for the stream
    p.in_flight[sent[-1].group_id] = Done(["j-0", "j-1"])
    asyncio.run(p.expire_lost())
    assert sent[-1].group_id in p.in_flight
