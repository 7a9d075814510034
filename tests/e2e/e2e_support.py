"""Helpers of the end-to-end tests (importable as `e2e_support`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evoenv_worker.serve import VllmServer
from shared.config import Settings


@dataclass
class Cluster:
    env: dict[str, str]
    """EVOENV_* settings every process of the cluster reads."""
    folder: Path
    server: VllmServer
    workers: list[subprocess.Popen[bytes]]

    def settings(self) -> Settings:
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)


def evoenv(*args: str) -> list[str]:
    """The CLI as a subprocess, with info-level (JSON) log lines."""
    return [sys.executable, "-c", "from evoenv_worker.cli import main; main()", "-v", *args]


def kill_group(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 30.0
) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(wait)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
