"""The best constant answer (`shared/baseline.py`): which texts are candidates, which one wins."""

from __future__ import annotations

import pytest

from shared.baseline import MAX_CANDIDATES, Constant, best_constant, candidates


def test_an_equality_candidate_is_the_most_frequent_reference() -> None:
    assert candidates("equality", ["b", "a", "b", "c"], ["a", "a", "a"]) == ["b"]


def test_equally_frequent_references_go_to_the_lexicographically_smallest() -> None:
    assert candidates("equality", ["odd", "even", "odd", "even"]) == ["even"]
    assert candidates("equality", ["z", "y", "x"]) == ["x"]


def test_feasibility_candidates_are_references_and_answers_most_frequent_first() -> None:
    texts = candidates("feasibility", ["3", "1", "3"], ["9", "1", "1"])
    assert texts == ["1", "3", "9"]  # 1 three times, 3 twice, 9 once


def test_feasibility_candidates_are_capped() -> None:
    references = [f"r{k:03}" for k in range(MAX_CANDIDATES + 10)]
    texts = candidates("feasibility", references, ["r039", "r039"])
    assert len(texts) == MAX_CANDIDATES
    assert texts[0] == "r039"  # the most frequent survives the cap
    assert candidates("feasibility", references, cap=2) == ["r000", "r001"]


def test_an_unknown_oracle_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="unknown oracle 'exact'"):
        candidates("exact", ["a"])


def test_the_text_passing_most_instances_wins_and_passes_are_rewards_of_one() -> None:
    # rows: instances; columns: the texts "a", "b", "c"
    rewards = [[1.0, 0.0, 0.9], [0.0, 1.0, 0.9], [0.0, 1.0, 0.9], [1.0, 0.0, 0.9]]
    found = best_constant(["a", "b", "c"], rewards)
    assert found == Constant("a", 0.5, (1.0, 0.0, 0.0, 1.0))  # a and b tie: the first wins
    assert found.non_modal([11, 12, 13, 14]) == [12, 13]
    assert best_constant(["b", "a", "c"], [[r[1], r[0], r[2]] for r in rewards]) == Constant(
        "b", 0.5, (0.0, 1.0, 1.0, 0.0)
    )


def test_a_constant_that_passes_nothing_scores_zero_and_every_instance_is_non_modal() -> None:
    found = best_constant(["x"], [[0.0], [0.5], [0.0]])
    assert found == Constant("x", 0.0, (0.0, 0.5, 0.0))
    assert found.non_modal([1, 2, 3]) == [1, 2, 3]


def test_equality_end_to_end_with_a_normalising_scorer() -> None:
    """The winner's score is what the scorer says, not string equality with the references."""
    references = ["Even", "odd", "Even", "even"]
    texts = candidates("equality", references)
    rewards = [[float(text.lower() == ref.lower()) for text in texts] for ref in references]
    assert best_constant(texts, rewards) == Constant("Even", 0.75, (1.0, 0.0, 1.0, 1.0))


def test_no_text_gives_no_constant_and_a_short_row_is_refused() -> None:
    assert best_constant([], []) is None
    with pytest.raises(ValueError, match="one reward per text"):
        best_constant(["a", "b"], [[1.0]])
