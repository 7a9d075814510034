"""Where the learner's metrics go: one structured log line per step, TensorBoard scalars, and
rows in the archive (for `evoenv status` and reports); and each step's samples."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from evoenv_learner.samples import as_markdown, step_samples
from shared.config import Settings
from shared.db import Archive
from shared.messages import GradedGroup

log = structlog.get_logger(__name__)


class MetricsSink:
    def __init__(self, settings: Settings, archive: Archive, tensorboard_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run = settings.run
        self.samples_steps = settings.learner.samples_steps
        self.samples_per_step = settings.learner.samples_per_step
        self.answer_cap = settings.validation.answer_cap
        self.archive = archive
        self.writer = SummaryWriter(str(tensorboard_dir))

    def train(self, step: int, version: int, values: dict[str, Any]) -> None:
        log.info("train_step", **{"step": step, **{k: _round(v) for k, v in values.items()}})
        self._scalars("train", step, values)
        self.archive.record_metrics(self.run, step, "train", version, _jsonable(values))

    def eval(self, step: int, version: int, values: dict[str, Any]) -> None:
        log.info(
            "evaluation", step=step, version=version, **{k: _round(v) for k, v in values.items()}
        )
        self._scalars("eval", step, values)
        self.archive.record_metrics(self.run, step, "eval", version, _jsonable(values))

    def samples(self, step: int, version: int, batch: Sequence[GradedGroup]) -> None:
        """The step's samples of `batch`, what it trained on (`evoenv_learner/samples.py`): a
        row of kind `samples` in the archive, the rows of all but the last
        `learner.samples_steps` steps forgotten, and TensorBoard's text tab."""
        if self.samples_steps == 0:
            return
        samples = step_samples(batch, self.samples_per_step, self.answer_cap)
        self.archive.record_metrics(self.run, step, "samples", version, {"samples": samples})
        self.archive.keep_last_metrics(self.run, "samples", self.samples_steps)
        self.writer.add_text("samples", as_markdown(step, samples), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _scalars(self, prefix: str, step: int, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)
        self.writer.flush()


def _round(value: Any) -> Any:
    """Five significant digits: a learning rate of 5e-6 stays 5e-06 (not 1e-05)."""
    return float(f"{value:.5g}") if isinstance(value, float) else value


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in values.items()
        if isinstance(v, (int, float, str, bool, type(None), list, dict))
    }
