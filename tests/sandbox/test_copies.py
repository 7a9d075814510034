"""The copies a child hands each routine (`runner._copier`): equal to the value, sharing nothing
mutable with it, with each other or with what the environment still holds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from evoenv_worker.sandbox import runner

SMALL = {"words": ["ba", "ko"], "grid": [[1, 2], [3, 4]], "meta": {"n": 2, "ok": True}, "x": None}
LARGE = {"rows": [[i, i + 1] for i in range(runner.COPY_TREE_CONTAINERS * 2)]}
"""More dicts and lists than the tree copier takes: copied through marshal."""


def containers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(c for item in value.values() for c in containers(item))]
    if isinstance(value, list):
        return [value, *(c for item in value for c in containers(item))]
    return []


@pytest.mark.parametrize("value", [SMALL, LARGE, [1, "a", 2.5], {"a": 1}, 7, "text", None])
def test_each_copy_is_equal_and_shares_no_container(value: Any) -> None:
    original = copy.deepcopy(value)
    fresh = runner._copier(value, True)
    first, second = fresh(), fresh()
    assert first == second == original
    assert type(first) is type(original)
    if isinstance(value, dict):
        assert list(first) == list(original)  # key order kept
    ids = {id(c) for c in containers(value)}
    assert not ids & {id(c) for c in containers(first)}
    assert not {id(c) for c in containers(first)} & {id(c) for c in containers(second)}


@pytest.mark.parametrize("value", [SMALL, LARGE])
def test_what_a_routine_does_to_a_copy_or_to_the_original_reaches_no_later_copy(
    value: Any,
) -> None:
    original = copy.deepcopy(value)
    held = copy.deepcopy(value)  # what the environment returned and may still hold
    fresh = runner._copier(held, True)
    given = fresh()
    for container in containers(given) + containers(held):
        if isinstance(container, dict):
            container["added"] = 1
        else:
            container.append("added")
    assert fresh() == original


def test_a_value_that_does_not_round_trip_is_copied_through_json() -> None:
    fresh = runner._copier({"pair": (1, 2)}, False)
    assert fresh() == {"pair": [1, 2]}
