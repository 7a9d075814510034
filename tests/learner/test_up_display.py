"""`evoenv up`'s live table, drawn from the learner's and the children's state at each refresh:
what it says before the learner runs, while the first step waits for groups it can learn from,
and after steps; a child that dies shows as down without waiting for the next step. Off a
terminal: the progress line's form, and when it comes (on a clock the test moves)."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.live import Live

from evoenv_cli.learner_state import state_path, write_state
from evoenv_cli.supervisor import Child, Supervisor
from evoenv_cli.up import _show
from evoenv_cli.up_display import Display, progress_lines
from evoenv_learner.loop import LearnerState


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
        display = Display(supervisor, batch_groups=2, started=0.0)
        text = _text(display)
        assert "starting" in text and "worker-grading" in text and " up " in text

        state = LearnerState()
        display.learner_started(state)
        state.skipped_groups = 5  # the loop updates the object in place
        text = _text(display)
        assert "waiting for 2 groups with different rewards" in text and "(5 skipped" in text
        assert "progress" in text and "tokens 0  judged 0" in text

        child.proc.kill()  # type: ignore[union-attr]
        child.proc.wait()  # type: ignore[union-attr]
        assert "down" in _text(display)

        state.step, state.version = 1, 1
        state.last_metrics = {"reward_mean_solver": 0.25, "pool": 10}
        state.funnel = {"L1": 3}
        text = _text(display)
        assert "1 / 1" in text and "0.250" in text and "L1: 3" in text
        assert "waiting" not in text and "progress" not in text  # its first step came
    finally:
        if child.alive:
            child.proc.kill()  # type: ignore[union-attr]
            child.proc.wait()  # type: ignore[union-attr]


class Clock:
    """A clock the test moves; sleeping on it moves it (no test sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_progress_line_before_and_once_the_learner_runs() -> None:
    clock = Clock()
    display = Display(Supervisor(), batch_groups=2, started=clock.now, clock=clock)
    clock.now += 12.4
    assert display.progress().line() == "progress  elapsed 12s  in flight 0  tokens 0  judged 0"
    state = LearnerState(tokens=812, funnel={"admitted": 1, "L3": 2, "expired": 4})
    state.in_flight = lambda: 4
    display.learner_started(state)
    clock.now += 47.6
    line = display.progress().line()
    assert line == "progress  elapsed 60s  in flight 4  tokens 812  judged 3"
    assert not line.startswith("step")
    assert "elapsed 60s  in flight 4  tokens 812  judged 3" in _text(display)


def test_progress_lines_come_within_a_minute_then_each_minute_until_the_first_step() -> None:
    clock = Clock()
    display = Display(Supervisor(), batch_groups=2, started=clock.now, clock=clock)
    state = LearnerState(step=5)  # resumed at step 5: its first step here is step 6
    lines: list[tuple[float, str]] = []

    def emit(line: str) -> None:
        lines.append((clock.now - display.started, line))
        if len(lines) == 2:
            display.learner_started(state)
        if len(lines) == 3:
            clock.now += 150.0  # the event loop was busy: missed lines are not caught up
        if len(lines) == 4:
            state.step = 6

    asyncio.run(progress_lines(display, emit, sleep=clock.sleep))
    assert [at for at, _ in lines] == [30.0, 90.0, 150.0, 330.0]
    assert all(line.startswith("progress  elapsed ") for _, line in lines)
    assert display.stepped


def test_off_a_terminal_each_step_has_one_line_however_often_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` reads the learner's file once a second and once more when it is asked to stop:
    a step read many times is one line, the stop one more."""
    display = Display(Supervisor(), batch_groups=1, started=0.0)
    live = Live(console=Console(file=io.StringIO()))
    path = state_path(tmp_path)
    state = LearnerState()
    write_state(path, state)
    _show(display, path, live)  # the learner runs, no step yet: no line
    for step in (1, 2):
        state.step, state.version = step, step + 1
        state.last_metrics = {"reward_mean_solver": 0.5 * step}
        write_state(path, state)
        _show(display, path, live)
        _show(display, path, live)
    state.stopping = True
    write_state(path, state)
    _show(display, path, live)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  solver")[0] for line in lines] == [
        "step 1  version 2",
        "step 2  version 3",
        "step 2  version 3",
    ]
    assert "0.500" in lines[0] and lines[2].endswith("then a checkpoint)")
