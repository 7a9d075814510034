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
from model_support import ServeProcess, lora_server_settings, model_settings
from support import register_server

from evoenv_model.models import prepare_model
from evoenv_model.serve import VllmServer, start_server
from shared.errors import ServiceUnavailable


@pytest.fixture(scope="session")
def small_model() -> Path:
    """The prepared SmolLM2-135M-Instruct folder (bf16 safetensors, tokenizer, template)."""
    return prepare_model(model_settings())


@pytest.fixture(scope="session")
def vllm_server(
    small_model: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[VllmServer]:
    """One vLLM server on the small model for the session, with adapters enabled
    (`lora_server_settings`), stopped at its end or when the end-to-end cluster starts
    (`support.stop_servers`), whichever comes first."""
    if any("serve_process" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("serve_process").start()  # its start overlaps this one's
    settings = lora_server_settings(port=free_port())
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


@pytest.fixture(scope="session")
def serve_process(
    small_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """`evoenv serve` of the small model in bfloat16 (`model_support.ServeProcess`): the
    log-prob test's bfloat16 server, then the one the SIGKILL test kills."""
    serve = ServeProcess(tmp_path_factory.mktemp("serve"), free_port())
    register_server(serve.stop)
    try:
        yield serve
    finally:
        serve.stop()


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
