"""End-to-end fixtures: the embedded model (Qwen2.5-Coder-0.5B-Instruct) served by vLLM, a
private Redis, and real worker processes on every queue. Slow: CI runs them.

One cluster serves every module that asks for `cluster` (starting one takes a minute); each
such module gets it back as a fresh one starts (`Cluster.reset`). The tests that use it run
last in the session (`tests/conftest.py`), after those that start servers of their own
(`test_up.py`, `tests/model/`), so that no two vLLM servers and trainers of the large model
share the machine's memory at once."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import Cluster, evoenv, kill_group
from support import free_port, stop_servers

from evoenv_model.models import prepare_model
from evoenv_model.serve import start_server
from shared.config import AdmissionSettings, ServeSettings, Settings
from shared.errors import ServiceUnavailable

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "evoenv"
E2E_SECRET = "the end-to-end cluster's validation secret"


@pytest.fixture(autouse=True)
def _drop_weight_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Checkpoints and pushed weights (GBs each) go when a test ends, passed or failed; its
    logs stay. Symbolic links (the prepared model, linked into data folders) are not followed."""
    yield
    for folder, _, names in os.walk(tmp_path_factory.getbasetemp()):
        for name in names:
            if name.endswith((".safetensors", ".pt")):
                (Path(folder) / name).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def shared_cluster(
    redis_server: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    stop_servers()  # the small model's server (tests/model): its tests have all run
    folder = tmp_path_factory.mktemp("e2e")
    port = free_port()
    env = {
        **os.environ,
        "EVOENV_REDIS_URL": redis_server.url,  # type: ignore[attr-defined]
        "EVOENV_DATA_DIR": str(CACHE),
        "EVOENV_DATABASE_URL": f"sqlite:///{folder / 'archive.db'}",
        "EVOENV_VLLM_URLS": f"http://127.0.0.1:{port}",
        "EVOENV_LOG_FORMAT": "json",
        # The model stages decide the same way on every run (test_admission.py), and
        # calibration's answers stop at 64 tokens: the sound file's sums are answered in about
        # 25, and its long products fail either way (a 512-token cap took 2.5x the time).
        "EVOENV_ADMISSION__SAMPLING_SEED": "2",
        "EVOENV_GRPO__MAX_TOKENS": "64",
        # L2-L5 and the model stages sample at seeds derived from this secret and the file: a
        # fixed one gives every run the same seeds (a fresh clone would write a random one).
        "EVOENV_VALIDATION__SECRET": E2E_SECRET,
    }
    settings = Settings(
        data_dir=CACHE,
        serve=ServeSettings(port=port, kv_cache_gib=1, max_model_len=4096),
        admission=AdmissionSettings(sampling_seed=2),  # served as seeded requests need
    )
    model = prepare_model(settings)
    log_path = folder / "vllm.log"
    with log_path.open("wb") as log_file:
        try:
            server = start_server(settings, model, output=log_file)
        except ServiceUnavailable as exc:
            pytest.fail(f"{exc}\n{log_path.read_text(errors='replace')[-3000:]}")
    workers = []
    for queues, extra in (
        ("generation", []),
        ("grading", ["-c", "1"]),
        ("validation", ["-c", "1"]),
    ):
        with (folder / f"worker-{queues}.log").open("wb") as log:
            workers.append(
                subprocess.Popen(
                    evoenv("worker", "-Q", queues, *extra),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    time.sleep(5)
    try:
        yield Cluster(env, folder, server, workers, model)
    finally:
        for worker in workers:
            kill_group(worker)
        server.stop()


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    """The session's cluster, as a fresh one starts (a module before may have trained)."""
    shared_cluster.reset()
    return shared_cluster
