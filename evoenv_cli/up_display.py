"""What `evoenv up` shows: on a terminal, a live table; off one (a log file), one line a step
and, until the first step, a progress line a minute (`Progress`, `progress_lines`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

FIRST_PROGRESS = 30.0
"""Seconds from the start of `up` to the first progress line: well within the first minute,
whatever the start-up's imports take before the loop that prints it runs."""
PROGRESS_EVERY = 60.0
"""Seconds between progress lines after the first."""


@dataclass(frozen=True)
class Progress:
    """The run's counts before its first step, as the progress line and table row show them.

    The first step can take half an hour on two cores (vLLM loads, then the first groups whose
    answers score differently are awaited), so the progress line says the run is alive and
    moving: `progress  elapsed 90s  in flight 4  tokens 812  judged 3`, never starting with
    "step" (a step's line does). In flight: solver and generator groups sent and not yet back;
    tokens: completion tokens in the groups the learner has read; judged: generated candidates
    that reached an admission verdict. All zero until the learner runs (while vLLM loads).
    """

    elapsed: float
    in_flight: int
    tokens: int
    judged: int

    def text(self) -> str:
        return (
            f"elapsed {round(self.elapsed)}s  in flight {self.in_flight}  "
            f"tokens {self.tokens}  judged {self.judged}"
        )

    def line(self) -> str:
        return f"progress  {self.text()}"


class Display:
    """The learner's state (once it runs), the children's, and the progress counts."""

    def __init__(
        self,
        supervisor: Any,
        batch_groups: int,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.supervisor = supervisor
        self.batch_groups = batch_groups
        self.started = started
        """`clock()` when `up` started."""
        self.clock = clock
        self.learner: Any = None
        self.starting: str | None = None
        """The child being started and waited for, if any."""
        self._first_step = 0
        self.shown: tuple[int, bool] | None = None
        """(step, stopping) of the last line printed off a terminal."""

    def learner_started(self, learner: Any) -> None:
        """The learner runs (from a checkpoint's step, when resumed): show its state."""
        self._first_step = learner.step + 1
        self.learner = learner

    @property
    def stepped(self) -> bool:
        """Whether the learner has taken a step since it started."""
        return self.learner is not None and self.learner.step >= self._first_step

    def progress(self) -> Progress:
        learner = self.learner
        elapsed = self.clock() - self.started
        if learner is None:
            return Progress(elapsed, 0, 0, 0)
        return Progress(elapsed, learner.in_flight(), learner.tokens, learner.judged)

    def table(self) -> Table:
        learner = self.learner
        table = Table(title="EvoEnv", show_header=False)
        if learner is None:
            table.add_row("learner", "starting (model, checkpoint) ...")
        elif learner.step == 0 and not learner.last_metrics and not learner.stopping:
            # on two cores the first step can take many minutes: groups whose answers all
            # score alike teach nothing and are skipped
            table.add_row(
                "learner",
                f"first step: waiting for {self.batch_groups} groups with different rewards "
                f"({learner.skipped_groups} skipped: all answers scored alike)",
            )
        else:
            self._learner_rows(table, learner)
        if not self.stepped:  # as the progress lines off a terminal
            table.add_row("progress", self.progress().text())
        for child in self.supervisor.children:
            table.add_row(child.name, self._child_state(child))
        return table

    def _learner_rows(self, table: Table, learner: Any) -> None:
        m = learner.last_metrics
        table.add_row("step / policy version", f"{learner.step} / {learner.version}")
        table.add_row("solver reward", _fmt(m.get("reward_mean_solver")))
        table.add_row("generator reward", _fmt(m.get("reward_mean_generator")))
        table.add_row("pool size", str(m.get("pool", "-")))
        table.add_row(
            "admission funnel",
            ", ".join(f"{k}: {v}" for k, v in sorted(learner.funnel.items())) or "-",
        )
        table.add_row(
            "in flight (solver / generator)",
            f"{m.get('in_flight_solver', '-')} / {m.get('in_flight_generator', '-')}",
        )
        table.add_row("stale groups dropped", str(learner.stale_dropped))
        if learner.stopping:
            table.add_row("stopping", "the step in progress is dropped; writing a checkpoint")

    def _child_state(self, child: Any) -> str:
        if child.name == self.starting:
            return "starting"
        if child.proc is None:
            return "not started"
        return ("up" if child.alive else "down") + (
            f", {child.restarts} restarts" if child.restarts else ""
        )

    def line(self, learner: Any) -> str:
        """The table's learner rows on one line, for output that is not a terminal."""
        m = learner.last_metrics
        funnel = ", ".join(f"{k}: {v}" for k, v in sorted(learner.funnel.items())) or "-"
        return (
            f"step {learner.step}  version {learner.version}  solver reward "
            f"{_fmt(m.get('reward_mean_solver'))}  generator reward "
            f"{_fmt(m.get('reward_mean_generator'))}  pool {m.get('pool', '-')}  "
            f"admission funnel {funnel}"
            + (
                "  (stopping: dropping the step in progress, then a checkpoint)"
                if learner.stopping
                else ""
            )
        )


async def progress_lines(
    display: Display,
    emit: Callable[[str], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Emit the progress line `FIRST_PROGRESS` seconds after `up` started, then every
    `PROGRESS_EVERY` seconds, until the learner's first step (then return). Lines missed while
    the event loop was busy are not caught up: the next one is the next due."""
    due = display.started + FIRST_PROGRESS
    while True:
        await sleep(max(0.0, due - display.clock()))
        if display.stepped:
            return
        emit(display.progress().line())
        while due <= display.clock():
            due += PROGRESS_EVERY


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"
