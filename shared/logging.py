"""The one `structlog.configure` of EvoEnv: JSON lines or console lines, to stderr (and, for
`evoenv up`, JSON lines to a file as well)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Literal

import structlog

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(fmt: Literal["console", "json"] = "console", level: str = "INFO") -> None:
    """Route structlog and the standard library's logging through one renderer on stderr."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(),
            exception_formatter=structlog.dev.plain_traceback,  # never the values of locals
        )
    )
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(renderer, fmt == "json"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def add_log_file(path: Path, level: str = "INFO") -> None:
    """Also write JSON lines at `level` to `path` (appended), whatever stderr shows: `evoenv
    up` keeps the terminal for its display and the learner's log in the run's logs folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_formatter(structlog.processors.JSONRenderer(), True))
    handler.setLevel(level.upper())
    root = logging.getLogger()
    for existing in root.handlers:
        if existing.level == logging.NOTSET:
            existing.setLevel(root.level)
    root.addHandler(handler)
    root.setLevel(min(root.level, handler.level))
    for chatty in ("httpx", "httpcore"):  # a line per request to the model server
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _formatter(renderer: structlog.types.Processor, exc_info: bool) -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if exc_info else _identity,
            renderer,
        ],
    )


def _identity(
    logger: object, name: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    return event
