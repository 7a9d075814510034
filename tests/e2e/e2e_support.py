"""Helpers of the end-to-end tests (importable as `e2e_support`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from evoenv_model.serve import VllmServer
from shared.config import Settings
from shared.hardware import cpu_flags, native_bf16

NATIVE_BF16 = native_bf16(cpu_flags())
"""Whether this CPU serves and trains in bfloat16 (AMX or AVX512-BF16). Without, in float32,
the end-to-end tests take about twice as long (docs/development.md, the suite's budget)."""


def within_float32_budget(minutes: int) -> pytest.MarkDecorator:
    """Skip a test that takes `minutes` on a CPU without native bfloat16, where the suite's
    end-to-end budget has no room for it; `EVOENV_E2E_ALL=1` runs it anyway. It runs in every
    CI run that draws a CPU with native bfloat16."""
    return pytest.mark.skipif(
        not NATIVE_BF16 and os.environ.get("EVOENV_E2E_ALL") != "1",
        reason=f"about {minutes} min in float32 on this CPU (no native bfloat16), over the "
        "suite's end-to-end budget; EVOENV_E2E_ALL=1 runs it",
    )


@dataclass
class Cluster:
    env: dict[str, str]
    """EVOENV_* settings every process of the cluster reads."""
    folder: Path
    server: VllmServer
    workers: list[subprocess.Popen[bytes]]
    model: Path
    """The prepared model folder the server started on."""

    def settings(self) -> Settings:
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def reset(self) -> None:
        """Back to how a fresh cluster starts: the server serves the prepared model's weights
        (a module before may have pushed its own) and Redis holds no policy version."""
        import httpx
        import redis

        from evoenv_learner.publisher import ServerControl
        from shared import keys

        with httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0)) as http:
            server = ServerControl(self.server.url, http)
            server.pause()
            try:
                server.reload(self.model)
                server.reset_prefix_cache()
                server.label(0)
            finally:
                server.resume()
        client = redis.Redis.from_url(self.env["EVOENV_REDIS_URL"])
        client.delete(keys.POLICY_VERSION)
        client.close()


def evoenv(*args: str) -> list[str]:
    """The CLI as a subprocess, with info-level (JSON) log lines."""
    return [sys.executable, "-c", "from evoenv_cli import main; main()", "-v", *args]


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
