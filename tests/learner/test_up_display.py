"""`evoenv up`'s live table, drawn from the learner's and the children's state at each refresh:
what it says before the learner runs, while the first step waits for groups it can learn from,
and after steps; a child that dies shows as down without waiting for the next step."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

from evoenv_learner.loop import LearnerState
from evoenv_learner.supervisor import Child, Supervisor
from evoenv_worker.cli.up import Display


def _text(display: Display) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(display.table())
    return console.export_text()


def test_the_table_follows_the_learner_and_the_children(tmp_path: Path) -> None:
    child = Child(
        "worker-grading",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        {},
        tmp_path / "w.log",
    )
    supervisor = Supervisor()
    supervisor.add(child)
    child.start()
    try:
        display = Display(supervisor, batch_groups=2)
        text = _text(display)
        assert "starting" in text and "worker-grading" in text and " up " in text

        state = LearnerState()
        display.learner = state
        state.skipped_groups = 5  # the loop updates the object in place
        text = _text(display)
        assert "waiting for 2 groups with different rewards" in text and "(5 skipped" in text

        child.proc.kill()  # type: ignore[union-attr]
        child.proc.wait()  # type: ignore[union-attr]
        assert "down" in _text(display)

        state.step, state.version = 1, 1
        state.last_metrics = {"reward_mean_solver": 0.25, "pool": 10}
        state.funnel = {"L1": 3}
        text = _text(display)
        assert "1 / 1" in text and "0.250" in text and "L1: 3" in text
        assert "waiting" not in text
    finally:
        if child.alive:
            child.proc.kill()  # type: ignore[union-attr]
            child.proc.wait()  # type: ignore[union-attr]
