"""Helpers of the model-runtime tests (importable as `model_support`; a test module importing
from `conftest` gets whichever conftest was imported first under that name)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from evoenv_cli.supervisor import descendants
from evoenv_model.models import TEST_MODEL
from shared.config import GrpoSettings, LearnerSettings, ServeSettings, Settings

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "evoenv"


def model_settings(**serve: object) -> Settings:
    """Settings for the small test model, its folder under the repository's cache.

    Served in float32: on a CPU with AMX and AVX512-BF16, vLLM's CPU build served
    SmolLM2-135M in bfloat16 derails (greedy "What is the capital of France?" gave "L'Etoile,
    la Marseillaise, la femme, ..."), while float32, and transformers in bfloat16, answer
    "The capital of France is Paris." The embedded Qwen2.5-Coder-0.5B answers the same in
    both dtypes there."""
    serve = {"dtype": "float32", **serve}
    return Settings(
        model=TEST_MODEL,
        data_dir=CACHE,
        serve=ServeSettings(kv_cache_gib=1, max_model_len=2048, start_timeout=300, **serve),  # type: ignore[arg-type]
    )


LORA = GrpoSettings.model_validate({"lora_rank": 8, "lora_alpha": 16, "compute_dtype": "float32"})
"""The LoRA tests' adapter: rank 8, trained in float32 (pushed in the server's float32)."""
MAX_STALENESS = 1
"""The LoRA tests' staleness: two adapter slots on the server."""


def lora_server_settings(**serve: object) -> Settings:
    """`model_settings` with adapters enabled (rank 8, `MAX_STALENESS + 1` slots): the session
    server's, so that the LoRA tests share it. Requests that name no adapter get the base
    model, so the full-weight tests run on it as on a plain server (measured: the keep-mode
    push test 72 s against 66, one run each). Seeded requests are served as where
    `admission.sampling_seed` is set (on a CPU, prompts prefilled whole)."""
    settings = model_settings(**serve)
    seeded = settings.admission.model_copy(update={"sampling_seed": 0})
    return settings.model_copy(
        update={
            "grpo": LORA,
            "learner": LearnerSettings(max_staleness=MAX_STALENESS),
            "admission": seeded,
        }
    )


class ServeProcess:
    """`evoenv serve` of the small model in bfloat16, started as a user starts it (a process
    whose child is the vLLM server), on a free port. `start()` starts it without waiting,
    `running()` starts it if need be and waits until it answers /health: the log-prob test
    asks it in bfloat16 and then the SIGKILL test kills it, so the session starts one server
    for both, and starts it beside the session's server (`vllm_server`), whose start it
    overlaps (each start is mostly one process importing vLLM: one core each)."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / f"serve-{self.starts}.log"

    def start(self) -> None:
        """Start `evoenv serve` unless it runs; do not wait for it (`running` does)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.starts += 1
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")},
            "EVOENV_MODEL": TEST_MODEL,
            "EVOENV_DATA_DIR": str(CACHE),
            "EVOENV_SERVE__DTYPE": "bfloat16",
            "EVOENV_SERVE__KV_CACHE_GIB": "1",
            "EVOENV_SERVE__MAX_MODEL_LEN": "2048",
        }
        command = [sys.executable, "-c", "from evoenv_cli import main; main()", "serve"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*command, "--port", str(self.port)], env=env, stdout=out, stderr=out
            )

    def running(self) -> subprocess.Popen[bytes]:
        """The live `evoenv serve` process, answering /health (started first if need be)."""
        self.start()
        assert self.proc is not None
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"evoenv serve did not come up:\n{tail}")
            time.sleep(1)
        return self.proc

    def _healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        return False

    def stop(self) -> None:
        """Kill the process and everything under it (safe to call twice)."""
        if self.proc is None:
            return
        tree = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for pid in tree | descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
