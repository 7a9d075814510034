"""`evoenv up --steps 3` with the default settings on a clean data folder: every component
starts, a generator group reaches the trainer, three optimiser steps run, the policy version
advances, the report is written, and nothing is left running. In the same run, once the first
step is done, the vLLM server and the grading worker are killed with SIGKILL: the supervisor
restarts both, the learner pushes its weights to the restarted server, and the run goes on.
(One run for both: on two cores a run takes most of twenty minutes.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_support import evoenv
from matplotlib import image

from evoenv_learner.supervisor import descendants
from shared.db import Archive

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "evoenv"


def events(log: Path) -> list[dict[str, object]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        start = line.find("{")
        if start >= 0:
            try:
                out.append(json.loads(line[start:]))
            except ValueError:
                continue
    return out


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A clean data folder that reuses the prepared model (preparing it takes minutes)."""
    folder = tmp_path / "data"
    (folder / "models").mkdir(parents=True)
    for model in (CACHE / "models").glob("*"):
        (folder / "models" / model.name).symlink_to(model)
    return folder


def up_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    return {**env, "EVOENV_DATA_DIR": str(data_dir), "EVOENV_LOG_FORMAT": "json", **extra}


def _watch_and_kill(
    proc: subprocess.Popen[bytes], data_dir: Path, log: Path
) -> tuple[set[int], dict[str, int]]:
    """Follow `up` until it ends, recording every descendant; once the first step is logged,
    SIGKILL the vLLM server and the grading worker (each a process group)."""
    ever: set[int] = set()
    killed: dict[str, int] = {}
    learner_log = data_dir / "runs" / "default" / "logs" / "learner.log"
    deadline = time.monotonic() + 40 * 60
    while proc.poll() is None and time.monotonic() < deadline:
        ever |= descendants(proc.pid)
        if not killed and learner_log.exists():
            seen_so_far = events(learner_log)
            if any(e.get("event") == "train_step" for e in seen_so_far):
                pids = {
                    e["child"]: int(str(e["pid"]))
                    for e in seen_so_far
                    if e.get("event") == "child_started"
                }
                for name in ("vllm", "worker-grading"):
                    os.killpg(pids[name], signal.SIGKILL)
                    killed[name] = pids[name]
        time.sleep(2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"evoenv up --steps 3 did not finish in 40 min:\n{log.read_text()[-5000:]}")
    return ever, killed


@pytest.mark.timeout(50 * 60)
def test_up_runs_three_steps_and_leaves_nothing(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            evoenv("up", "--steps", "3"),
            env=up_env(data_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        ever, killed = _watch_and_kill(proc, data_dir, log)
    finally:
        if proc.poll() is None:  # the test failed or was interrupted: take everything down
            for pid in descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-5000:]
    run_logs = sorted((data_dir / "runs" / "default" / "logs").glob("*.log"))
    # learner.log has every event of the up process itself (up.log repeats those at -v)
    seen = [e for path in run_logs for e in events(path)]
    names = {e.get("event") for e in seen}
    started = {e.get("child") for e in seen if e.get("event") == "child_started"}
    assert {
        "redis",
        "vllm",
        "worker-generation",
        "worker-validation",
        "worker-grading",
        "flower",
    } <= started
    assert "learner_started" in names
    assert set(killed) == {"vllm", "worker-grading"}, "the first step never came"
    restarted = sorted(str(e.get("child")) for e in seen if e.get("event") == "child_restarted")
    # once each: a killed server that left its engine behind (holding the port) made every
    # restart fail until the orphan went away
    assert restarted == ["vllm", "worker-grading"]
    # the restarted server was given the current weights (by the next step's push, or by a
    # push of its own if no step came first)
    (back,) = [e for e in seen if e.get("event") == "child_restarted" and e["child"] == "vllm"]
    assert any(
        str(e["timestamp"]) > str(back["timestamp"])
        for e in seen
        if e.get("event") == "weights_published"
    ), "no push reached the restarted server"
    steps = [e for e in seen if e.get("event") == "train_step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    # Off a terminal (here a file), the live table is one line a step.
    for step in (1, 2, 3):
        assert f"step {step}  version " in text, f"no progress line for step {step}"
    pushes = [e for e in seen if e.get("event") == "weights_published"]
    assert len(pushes) >= 2 and pushes[-1]["version"] > pushes[0]["version"]
    generator = [e for e in seen if e.get("event") in {"generation_group_done"}]
    assert generator, "no generation group completed"
    consumed = any(
        e.get("event") == "group_skipped" and e.get("role") == "generator" for e in seen
    ) or any((e.get("reward_mean_generator") is not None) for e in steps)
    assert consumed, "no generator group reached the trainer"
    report = data_dir / "runs" / "default" / "report"
    assert (report / "report.md").is_file()
    pngs = sorted(report.glob("*.png"))
    assert len(pngs) >= 5
    for png in pngs:
        pixels = image.imread(png)
        assert (
            pixels.size > 0
            and len({float(v) for v in pixels.reshape(-1)[:: max(1, pixels.size // 5000)]}) > 1
        )
    archive = Archive(f"sqlite:///{data_dir / 'archive.db'}")
    assert len(archive.metrics("default", "train")) == 3
    time.sleep(2)
    alive = {pid for pid in ever if Path(f"/proc/{pid}").exists()}
    assert not alive, f"processes left behind: {sorted(alive)}"
