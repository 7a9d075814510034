"""The graded group's typed data on the wire, and messages of another schema version."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from shared.errors import SchemaMismatch
from shared.messages import (
    SCHEMA_VERSION,
    GeneratorGroupData,
    GradedCompletion,
    GradedGroup,
    ProposalJob,
    SolverGroupData,
    SolverJob,
)
from shared.rollouts import decode_entry

COMPLETION = {
    "text": "<answer>4</answer>",
    "prompt_token_ids": [1, 2],
    "token_ids": [3, 4],
    "logprobs": [-0.5, -0.25],
    "finish_reason": "stop",
    "policy_version": 3,
    "reward": 1.0,
    "outcome": "scored",
    "detail": "",
}


def v1_entry(role: str, data: dict[str, Any], version: int = 1) -> dict[bytes, bytes]:
    """A stream entry exactly as version 1 wrote it (`data` a free dict then)."""
    group = {
        "schema_version": version,
        "run": "r",
        "group_id": f"{role}-1",
        "role": role,
        "env_name": "(generator)" if role == "generator" else "sort_words",
        "env_sha": "" if role == "generator" else "abc",
        "seed": 7,
        "difficulty": 2,
        "prompt": "p",
        "policy_version": 3,
        "completions": [COMPLETION],
        "data": data,
    }
    return {b"group": json.dumps(group).encode()}


def graded(role: str, data: SolverGroupData | GeneratorGroupData) -> GradedGroup:
    return GradedGroup(
        run="r",
        group_id="g",
        role=role,  # type: ignore[arg-type]
        env_name="e",
        env_sha="s",
        seed=0,
        difficulty=1,
        prompt="p",
        policy_version=0,
        completions=[GradedCompletion.model_validate(COMPLETION)],
        data=data,
    )


@pytest.mark.parametrize(
    ("role", "data"),
    [
        ("solver", SolverGroupData()),
        ("solver", SolverGroupData(over_budget=True)),
        ("solver", SolverGroupData(env_error="sampling failed: boom")),
        ("solver", SolverGroupData(dishonest="a hidden probe: the empty answer scored 1")),
        ("solver", SolverGroupData(reference="7")),
        ("generator", GeneratorGroupData(funnel=["L3", "admitted"], gamma=0.8, parents=["a"])),
        (
            "generator",
            GeneratorGroupData(funnel=["L2"], gamma=2.0, mode="repair", repair_of="g0"),
        ),
    ],
)
def test_a_graded_group_round_trips_through_the_stream_entry(
    role: str, data: SolverGroupData | GeneratorGroupData
) -> None:
    group = graded(role, data)
    assert group.schema_version == SCHEMA_VERSION == 5
    read = decode_entry({b"group": group.model_dump_json().encode()})
    assert read == group and type(read.data) is type(data)


def test_a_groups_data_is_that_of_its_role_and_nothing_else() -> None:
    with pytest.raises(ValidationError, match="a generator group's data is a GeneratorGroupData"):
        graded("generator", SolverGroupData())
    with pytest.raises(ValidationError, match="a solver group's data is a SolverGroupData"):
        graded("solver", GeneratorGroupData(funnel=["L1"], gamma=1.0))
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SolverGroupData.model_validate({"over_budget": True, "stage_results": []})
    with pytest.raises(ValidationError, match="funnel"):  # an outcome no stage has
        GeneratorGroupData.model_validate({"funnel": ["L9"], "gamma": 1.0})


@pytest.mark.parametrize(
    ("role", "data", "expected"),
    [
        ("solver", {}, SolverGroupData()),
        ("solver", {"over_budget": True}, SolverGroupData(over_budget=True)),
        (
            "solver",
            {"env_error": "grading failed: x"},
            SolverGroupData(env_error="grading failed: x"),
        ),
        (
            "generator",
            {"funnel": ["novelty", "admitted", "error"], "gamma": 0.75, "parents": ["p1"]},
            GeneratorGroupData(funnel=["novelty", "admitted", "error"], gamma=0.75, parents=["p1"]),
        ),
    ],
)
def test_a_version_1_stream_entry_is_read_into_the_typed_data(
    role: str, data: dict[str, Any], expected: SolverGroupData | GeneratorGroupData
) -> None:
    group = decode_entry(v1_entry(role, data))
    assert group.schema_version == 1 and group.data == expected
    assert group.completions[0].logprobs == [-0.5, -0.25]


def test_a_version_1_entry_whose_data_does_not_fit_is_malformed_not_a_version_problem() -> None:
    with pytest.raises(ValidationError) as caught:
        decode_entry(v1_entry("generator", {"funnel": ["L1"]}))  # no gamma: never written so
    assert not isinstance(caught.value, SchemaMismatch)


@pytest.mark.parametrize("version", [0, 6])
def test_an_entry_of_a_version_not_read_names_both_versions(version: int) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        decode_entry(v1_entry("solver", {}, version=version))
    message = str(caught.value)
    assert "\n" not in message
    assert f"schema version {version}; this EvoEnv reads versions 1-5" in message
    assert "same EvoEnv version" in message  # what to do


def test_jobs_of_version_1_are_still_read_and_others_refused() -> None:
    job = {"run": "r", "group_id": "g", "env": {"name": "e", "sha": "s", "source": "x"}}
    assert SolverJob.model_validate({**job, "seed": 1, "difficulty": 2, "schema_version": 1})
    with pytest.raises(ValidationError, match="reads versions 1-5"):
        SolverJob.model_validate({**job, "seed": 1, "difficulty": 2, "schema_version": 6})


def test_a_version_2_generation_group_is_read_as_topic_and_a_repair_job_names_its_group() -> None:
    entry = v1_entry("generator", {"funnel": ["L1"], "gamma": 2.0}, version=2)
    group = decode_entry(entry)
    assert isinstance(group.data, GeneratorGroupData)
    assert (group.data.mode, group.data.repair_of) == ("topic", None)
    job = {"run": "r", "group_id": "g", "messages": []}
    assert ProposalJob.model_validate({**job, "mode": "repair", "repair_of": "g0"}).repair_of
    with pytest.raises(ValidationError, match="names the group it repairs"):
        ProposalJob.model_validate({**job, "mode": "repair"})
    with pytest.raises(ValidationError, match="names the group it repairs"):
        ProposalJob.model_validate({**job, "mode": "topic", "repair_of": "g0"})
