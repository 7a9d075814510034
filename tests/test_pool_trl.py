"""A real client of `evoenv pool export --format reasoning-gym`: the exported package, installed
by pip into a private folder, feeds one step of TRL's `GRPOTrainer` on the small model (CPU,
float32), its reward function scoring each completion with the package's `score_answer`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import missing, pip_install_target
from typer.testing import CliRunner

from evoenv_cli import app
from evoenv_model.models import TEST_MODEL, prepare_model
from shared.config import Settings

REPO = Path(__file__).resolve().parents[1]

ONE_STEP = """
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from evoenv_pool import create_dataset, extract_answer, score_answer

model_dir, out_dir = sys.argv[1], sys.argv[2]
data = create_dataset("all", seed=0, size=2, difficulty=1)
train = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": e["question"]}], "index": i} for i, e in enumerate(data)]
)
rewards = []

def reward(completions, index, **kwargs):
    got = [score_answer(extract_answer(c[0]["content"]), data[i]) for c, i in zip(completions, index)]
    rewards.extend(got)
    return got

torch.manual_seed(0)
args = GRPOConfig(
    output_dir=out_dir, max_steps=1, per_device_train_batch_size=4, num_generations=2,
    max_completion_length=16, learning_rate=1e-6, logging_steps=1, save_strategy="no",
    report_to="none", use_cpu=True, bf16=False, seed=0,
)
trainer = GRPOTrainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
    processing_class=AutoTokenizer.from_pretrained(model_dir),
    reward_funcs=reward,
    args=args,
    train_dataset=train,
)
trainer.train()
print(json.dumps({
    "global_step": trainer.state.global_step,
    "log_history": trainer.state.log_history,
    "rewards": rewards,
    "references": [score_answer(e["answer"], e) for e in data],
    "environments": [e["metadata"]["environment"] for e in data],
}))
"""


@pytest.mark.integration
def test_one_grpo_step_of_trl_on_the_exported_pool(
    tmp_path: Path, claim: Callable[[str], None]
) -> None:
    # The small model in the tests' data folder, as the model tests' `small_model` fixture
    # prepares it: about 20 s the first time (this tier runs before theirs), then a check.
    model = prepare_model(Settings(model=TEST_MODEL, data_dir=REPO / ".cache" / "evoenv"))
    if importlib.util.find_spec("trl") is None:
        missing("TRL is not installed (the dev extra has it: scripts/setup.sh installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
    env["EVOENV_DATABASE_URL"] = f"sqlite:///{tmp_path / 'archive.db'}"  # the seeds alone
    exported = CliRunner().invoke(
        app, ["pool", "export", "--format", "reasoning-gym", str(tmp_path / "pool")], env=env
    )
    assert exported.exit_code == 0, (exported.output, exported.exception)
    pip_install_target(tmp_path / "pool", tmp_path / "site")
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", ONE_STEP, str(model), str(tmp_path / "out")],
        env={**env, **offline, "PYTHONPATH": str(tmp_path / "site"), "HF_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    claim(f"TRL GRPOTrainer, one step on the exported pool: {seconds:.0f} s")

    assert result["global_step"] == 1
    step = result["log_history"][0]
    assert 0.0 <= step["reward"] <= 1.0 and step["completions/mean_length"] > 0
    assert len(result["rewards"]) == 4  # two prompts, two completions each
    assert all(0.0 <= r <= 1.0 for r in result["rewards"])
    assert result["references"] == [1.0, 1.0]
    assert len(set(result["environments"])) == 2
