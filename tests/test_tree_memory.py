"""`evoenv up`'s memory samples (`tree_memory`), their peak in the run report, and the learner's
state file that `up` shows (`learner_state`)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evoenv_cli import tree_memory
from evoenv_cli.learner_state import read_state, state_path, write_state
from evoenv_cli.run_report import memory_section
from evoenv_cli.up_display import Display


def test_a_sample_counts_a_process_that_holds_memory() -> None:
    # a child that touches 300 MiB: its group's share is at least that, and the total more
    code = "b = bytearray(300 * 2**20); import sys; sys.stdout.write('ok\\n'); sys.stdout.flush(); input()"
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "ok\n"
            record = tree_memory.sample({"up": {os.getpid()}, "holder": {child.pid}})
        finally:
            child.kill()
    assert record["by_child"]["holder"] >= 0.29
    assert record["pss_gib"] >= record["by_child"]["holder"] + record["by_child"]["up"] - 0.01
    assert record["rss_gib"] >= record["pss_gib"] - 0.01
    assert tree_memory.process_memory(child.pid) is None  # gone


def test_the_peak_is_the_largest_sample_and_each_child_its_own_largest(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    samples = [
        {"time": 0.0, "pss_gib": 10.0, "rss_gib": 11.0, "by_child": {"learner": 8.0, "vllm": 2.0}},
        {"time": 10.0, "pss_gib": 14.0, "rss_gib": 15.0, "by_child": {"learner": 9.0, "vllm": 5.0}},
        {
            "time": 20.0,
            "pss_gib": 12.0,
            "rss_gib": 13.0,
            "by_child": {"learner": 10.0, "vllm": 2.0},
        },
    ]
    for record in samples:
        tree_memory.append(path, record)
    with path.open("a") as out:
        out.write("not json\n")
    read = tree_memory.read(path)
    assert read == samples
    top = tree_memory.peak(read)
    assert top is not None
    assert (top["pss_gib"], top["at"], top["samples"], top["seconds"]) == (14.0, 10.0, 3, 20.0)
    assert top["by_child_peak"] == {"learner": 10.0, "vllm": 5.0}
    text = "\n".join(memory_section(read))
    assert "**14.00 GiB**" in text and "| learner | 10.00 |" in text
    assert "No memory samples" in "\n".join(memory_section([]))


@dataclass
class _State:
    step: int = 3
    version: int = 4
    stale_dropped: int = 1
    skipped_groups: int = 2
    funnel: dict[str, int] = field(default_factory=lambda: {"L2": 3, "expired": 4})
    last_metrics: dict[str, Any] = field(
        default_factory=lambda: {"reward_mean_solver": 0.25, "pool": 10}
    )
    stopping: bool = False
    tokens: int = 812

    def in_flight(self) -> int:
        return 5


def test_the_learner_state_file_round_trips_into_what_up_shows(tmp_path: Path) -> None:
    path = state_path(tmp_path)
    assert read_state(path) is None
    write_state(path, _State())
    view = read_state(path)
    assert view is not None
    assert (view.pid, view.step, view.version, view.tokens) == (os.getpid(), 3, 4, 812)
    assert (view.in_flight(), view.judged, view.stale_dropped) == (5, 3, 1)
    display = Display(supervisor=type("S", (), {"children": []})(), batch_groups=1, started=0.0)
    display.learner_started(view)
    line = display.line(view)
    assert line.startswith("step 3  version 4  solver reward 0.250") and "L2: 3" in line
    path.write_text("{half")
    assert read_state(path) is None
