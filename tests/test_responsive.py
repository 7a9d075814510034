"""Which of `up`'s workers count as silent (`responsive.Silence`), from the answers to pings."""

from __future__ import annotations

from evoenv_cli.responsive import Silence
from evoenv_worker.broker import NODE


def test_a_worker_silent_while_another_answers_is_replaced_after_the_limit() -> None:
    silence = Silence(after=60, every=15)  # four pings
    assert silence.heard({1, 2}, [1, 2]) == []
    for _ in range(3):
        assert silence.heard({2}, [1, 2]) == []
    assert silence.heard({2}, [1, 2]) == [1]
    assert silence.heard({2}, [1, 2]) == []  # counted again from zero (it is being replaced)


def test_an_answer_resets_the_count_and_a_ping_nobody_answered_counts_for_none() -> None:
    silence = Silence(after=30, every=15)
    silence.heard({1, 2}, [1, 2])
    assert silence.heard({2}, [1, 2]) == []
    assert silence.heard({1, 2}, [1, 2]) == []  # it answered: from zero again
    assert silence.heard({2}, [1, 2]) == []
    for _ in range(5):  # the broker away: nobody answers, nobody is blamed
        assert silence.heard(set(), [1, 2]) == []
    assert silence.heard({2}, [1, 2]) == [1]


def test_a_worker_that_never_answered_is_starting_not_silent() -> None:
    silence = Silence(after=15, every=15)
    for _ in range(4):
        assert silence.heard({2}, [1, 2]) == []
    # a restarted worker has a new pid: the old one's count is dropped
    silence.heard({1, 2}, [1, 2])
    assert silence.heard({2}, [2, 3]) == [] and 1 not in silence.misses


def test_the_node_names_evoenv_worker_gives() -> None:
    found = NODE.match("grading-9010@vm")
    assert found is not None and found.group(1) == "9010"
    found = NODE.match("generation,grading-77@host.example")
    assert found is not None and found.group(1) == "77"
    assert NODE.match("celery@vm") is None
