"""kill -9 of the learner mid-run, then --resume: training continues from the checkpoint's
version, no group is trained twice in the final history, and the server serves the latest
version. Real Redis, real workers, vLLM on the embedded model, the real trainer."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from e2e_support import Cluster, evoenv, kill_group

from evoenv_learner.checkpoints import latest_checkpoint
from shared.db import Archive
from shared.inference import InferenceClient, Sampling
from shared.policy import read_version

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ENV_FILE = Path(__file__).with_name("copy_word.py")


def learner_env(cluster: Cluster, run_dir: Path, steps: int) -> dict[str, str]:
    return {
        **cluster.env,
        "EVOENV_RUN": "resume-test",
        "EVOENV_LEARNER__RUN_DIR": str(run_dir),
        "EVOENV_LEARNER__STEPS": str(steps),
        "EVOENV_LEARNER__ENVIRONMENTS": '["copy_word"]',
        "EVOENV_LEARNER__DIFFICULTY": "1",
        "EVOENV_LEARNER__GENERATOR_GROUPS_IN_FLIGHT": "0",
        "EVOENV_LEARNER__SOLVER_GROUPS_IN_FLIGHT": "3",
        "EVOENV_LEARNER__CHECKPOINT_EVERY": "1",
        "EVOENV_LEARNER__KEEP_CHECKPOINTS": "1",
        "EVOENV_LEARNER__EVAL_EVERY": "1000",
        # One group of 4 a step, one micro-batch, no recomputation: a step of the 0.5B model
        # on two cores in about 2/3 of the time of groups of 6 with gradient checkpointing.
        "EVOENV_GRPO__GROUP_SIZE": "4",
        "EVOENV_GRPO__BATCH_GROUPS": "1",
        "EVOENV_GRPO__MAX_TOKENS": "32",
        "EVOENV_GRPO__MICRO_BATCH": "4",
        "EVOENV_GRPO__GRADIENT_CHECKPOINTING": "false",
    }


def wait_for(
    predicate, timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path
) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None and not predicate():
            pytest.fail(
                f"the learner exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(1.0)


def test_learner_resumes_after_kill_9(cluster: Cluster, tmp_path: Path) -> None:
    settings = cluster.settings()
    archive = Archive(settings.archive_url)
    archive.add_environment("copy_word", ENV_FILE.read_text(), status="admitted", origin="user")
    run_dir = tmp_path / "run"
    log = tmp_path / "learner.log"
    client = redis.Redis.from_url(settings.redis_url)

    with log.open("ab") as out:
        first = subprocess.Popen(
            evoenv("learner", "--steps", "6"),
            env=learner_env(cluster, run_dir, 6),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        checkpoints = run_dir / "checkpoints"
        wait_for(
            lambda: (c := latest_checkpoint(checkpoints)) is not None and c.name >= "step-00000001",
            900,
            "checkpoint at step 1",
            first,
            log,
        )
        time.sleep(5)  # let it get into the next step: read groups, maybe train them, then die
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        kill_group(first, signal.SIGKILL)
    checkpoint = latest_checkpoint(checkpoints)
    assert checkpoint is not None
    state = json.loads((checkpoint / "state.json").read_text())
    checkpoint_version = int(state["extra"]["version"])
    checkpoint_step = int(state["step"])
    version_at_kill = read_version(client)
    assert version_at_kill >= checkpoint_version

    with log.open("ab") as out:
        second = subprocess.run(
            evoenv("learner", "--resume", "--steps", str(checkpoint_step + 1)),
            env=learner_env(cluster, run_dir, checkpoint_step + 1),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    text = log.read_text()
    assert second.returncode == 0, text[-4000:]
    resumed = [json.loads(line) for line in text.splitlines() if '"learner_resumed"' in line]
    assert resumed and resumed[-1]["step"] == checkpoint_step
    # The resumed learner pushed the checkpoint's weights as a new version, above both.
    assert resumed[-1]["version"] == max(checkpoint_version, version_at_kill) + 1
    final_version = read_version(client)
    assert final_version > resumed[-1]["version"]

    rows = archive.metrics("resume-test", "train")
    assert [r.step for r in rows] == list(range(1, checkpoint_step + 2))
    trained = [g for r in rows for g in r.values["groups_trained"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    versions = [r.version for r in rows]
    assert versions == sorted(versions)

    with InferenceClient(settings.vllm_urls, settings.model) as inference:
        (completion,) = inference.chat(
            [{"role": "user", "content": "Say hi."}], Sampling(max_tokens=4)
        )
    assert completion.policy_version == final_version
    client.close()
