"""`python -m evoenv_learner`: parse settings, configure logging, run the learner.

Without the workers' code, which the learner may not import, a generation group past its
deadline only frees its slot here (its record is not closed, its candidates not recorded as
expired), as a warning says at start: `evoenv learner` is the full learner (`loop.GroupExpiry`)."""

from __future__ import annotations

import sys

from evoenv_learner.loop import run_process
from shared.config import Settings
from shared.logging import configure_logging


def main() -> None:
    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    run_process(settings, resume="--resume" in sys.argv[1:])


if __name__ == "__main__":
    main()
