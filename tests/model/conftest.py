"""Fixtures of the model-runtime tests: the small model, prepared once, and ONE vLLM server.

The server (SmolLM2-135M-Instruct on the CPU build, or the CUDA build where a GPU is) is
session-scoped and shared by every `slow` test; its log goes to a file whose tail is shown if
it fails to start. The prepared model is cached under the repository's ignored `.cache/`, so
only the first run pays the ~20 s to make it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_vllm import FakeServer, free_port
from support import register_server

from evoenv_model.models import TEST_MODEL, prepare_model
from evoenv_model.serve import VllmServer, start_server
from shared.config import ServeSettings, Settings
from shared.errors import ServiceUnavailable

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


@pytest.fixture(scope="session")
def small_model() -> Path:
    """The prepared SmolLM2-135M-Instruct folder (bf16 safetensors, tokenizer, template)."""
    return prepare_model(model_settings())


@pytest.fixture(scope="session")
def vllm_server(
    small_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """One vLLM server on the small model for the session, stopped at its end or when the
    end-to-end cluster starts (`support.stop_servers`), whichever comes first."""
    settings = model_settings(port=free_port())
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    with log_path.open("wb") as log_file:
        try:
            server = start_server(settings, small_model, output=log_file)
        except ServiceUnavailable as exc:
            tail = log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"{exc}\n--- server log (tail) ---\n{tail}")
        register_server(server.stop)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def fake_servers() -> Iterator[Callable[[], FakeServer]]:
    """Start fake servers on demand; all are closed after the test."""
    started: list[FakeServer] = []

    def start() -> FakeServer:
        started.append(FakeServer())
        return started[-1]

    yield start
    for server in started:
        server.close()


@pytest.fixture
def fake_server(fake_servers: Callable[[], FakeServer]) -> FakeServer:
    return fake_servers()


@pytest.fixture
def dead_url() -> str:
    """The URL of a port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"
