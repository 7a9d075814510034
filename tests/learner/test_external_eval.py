"""The reasoning-gym suite without a server: prompts, scoring, summaries and the CLI's usage
errors. Completions come from a stand-in function; the real path is tests/model's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import free_port
from typer.testing import CliRunner

from evoenv_cli import app
from evoenv_learner.reasoning_gym_eval import (
    DEFAULT_TASKS,
    SEED,
    Item,
    build_items,
    run_items,
    score_response,
    summarise_scores,
    task_names,
)
from shared.environment import ANSWER_INSTRUCTION, build_prompt
from shared.errors import ServiceUnavailable, UsageError


def answering(reply: Callable[[Item], str], items: list[Item]) -> Callable[[str], Awaitable[str]]:
    """A completion function that answers each item's prompt with `reply(item)`."""
    by_prompt = {item.prompt: item for item in items}

    async def complete(prompt: str) -> str:
        await asyncio.sleep(0)
        return reply(by_prompt[prompt])

    return complete


def run(items: list[Item], reply: Callable[[Item], str]) -> dict[str, Any]:
    return summarise_scores(asyncio.run(run_items(items, answering(reply, items), 4)))


def test_the_prompt_is_the_question_then_our_answer_instruction() -> None:
    (item,) = build_items(["chain_sum"], 1)
    assert item.prompt == build_prompt(item.entry["question"])
    assert item.prompt.endswith(ANSWER_INSTRUCTION)


@pytest.mark.parametrize("task", DEFAULT_TASKS)
def test_the_reference_answer_in_tags_passes_on_every_default_task(task: str) -> None:
    items = build_items([task], 4)
    summary = run(items, lambda item: f"Thinking.\n<answer>{item.entry['answer']}</answer>")
    assert summary["pass_rate"] == 1.0 and summary["mean_score"] == 1.0
    assert summary[f"instances_{task}"] == 4 and summary["format_errors"] == 0


def test_a_wrong_answer_fails() -> None:
    items = build_items(["chain_sum", "spell_backward"], 3)
    summary = run(items, lambda item: "<answer>certainly not this</answer>")
    assert summary["pass_rate"] == 0.0 and summary["format_errors"] == 0
    assert summary["instances"] == 6 and summary["ci_low"] == 0.0 and summary["ci_high"] > 0.0


def test_a_response_without_tags_is_a_format_error_even_if_right() -> None:
    (item,) = build_items(["chain_sum"], 1)
    scored = score_response(item, f"The answer is {item.entry['answer']}.")
    assert scored.format_error and scored.score == 0.0 and not scored.passed
    thinking = score_response(item, f"<think><answer>{item.entry['answer']}</answer>")
    assert thinking.format_error


def test_partial_credit_counts_in_the_mean_score_but_is_not_a_pass() -> None:
    (item,) = build_items(["basic_arithmetic"], 1)
    scored = score_response(item, f"<answer>{item.entry['answer']}.0</answer>")
    assert 0.0 < scored.score < 1.0 and not scored.passed


def test_an_unknown_task_is_one_line_naming_the_valid_ones() -> None:
    with pytest.raises(UsageError) as caught:
        build_items(["chain_sum", "no_such_task"], 2)
    message = str(caught.value)
    assert "no_such_task" in message and "\n" not in message
    assert all(name in message for name in task_names())


def test_instances_are_fixed_by_the_seed_and_n_is_a_prefix() -> None:
    few = build_items(["leg_counting"], 2)
    many = build_items(["leg_counting"], 5)
    assert [i.prompt for i in few] == [i.prompt for i in many[:2]]
    assert [i.prompt for i in build_items(["leg_counting"], 2, seed=SEED + 1)] != [
        i.prompt for i in few
    ]


def test_requests_in_flight_are_bounded_and_results_keep_item_order() -> None:
    items = build_items(["chain_sum", "letter_counting"], 6)
    in_flight, most = 0, 0
    done: list[str] = []

    async def complete(prompt: str) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return "<answer>0</answer>"

    scored = asyncio.run(run_items(items, complete, 3, lambda s: done.append(s.task)))
    assert most == 3
    assert [s.task for s in scored] == [i.task for i in items] and len(done) == 12


def test_the_first_failure_is_raised_as_itself() -> None:
    items = build_items(["chain_sum"], 4)

    async def complete(prompt: str) -> str:
        raise ServiceUnavailable("every server is down")

    with pytest.raises(ServiceUnavailable, match="every server is down"):
        asyncio.run(run_items(items, complete, 2))


def test_the_summary_has_per_task_and_overall_figures() -> None:
    items = build_items(["chain_sum", "spell_backward"], 2)
    summary = run(
        items,
        lambda item: (
            f"<answer>{item.entry['answer']}</answer>" if item.task == "chain_sum" else "no tags"
        ),
    )
    assert summary["suite"] == "reasoning-gym" and summary["seed"] == SEED
    assert summary["pass_rate_chain_sum"] == 1.0 and summary["pass_rate_spell_backward"] == 0.0
    assert summary["format_errors_spell_backward"] == 2 and summary["format_errors"] == 2
    assert summary["pass_rate"] == 0.5 and summary["mean_score"] == 0.5
    assert summary["ci_low"] < 0.5 < summary["ci_high"]


# ------------------------------------------------------------------------------------- the CLI


def test_the_help_names_the_default_tasks_and_the_seed() -> None:
    result = CliRunner().invoke(app, ["eval", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert all(task in result.output for task in DEFAULT_TASKS)
    assert f"seed {SEED}" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--suite", "reasoning-gym", "--difficulty", "3"], "--difficulty does not apply"),
        (["--suite", "reasoning-gym", "--env", "x"], "--env does not apply"),
        (["--task", "chain_sum"], "--task applies only"),
        (["--suite", "reasoning-gym", "--task", "nope"], "unknown reasoning-gym task"),
    ],
)
def test_usage_errors(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["eval", *args])
    assert isinstance(result.exception, UsageError) and says in str(result.exception)


def test_no_reachable_server_is_one_line_and_exit_3() -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        app,
        ["eval", "--suite", "reasoning-gym", "-n", "1", "--json"],
        env={"EVOENV_VLLM_URLS": f"{dead_url},{dead_url}/"},
    )
    assert result.exit_code == 3, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: no model server answers /health")


def test_the_cli_does_not_import_reasoning_gym_until_the_suite_runs() -> None:
    import subprocess
    import sys

    code = "import sys, evoenv_cli; sys.exit('reasoning_gym' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0
