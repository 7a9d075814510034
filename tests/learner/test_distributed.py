"""Data-parallel training (`distributed.py`): two real processes joined by gloo, as torchrun
starts them, train the tiny policy exactly as one process does, every weight or a LoRA adapter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from support import free_port
from tiny_policy import make_group, settings, weights

from evoenv_learner.distributed import DataParallel
from evoenv_learner.trainer import Trainer
from shared.messages import GradedGroup

WORLD = 2
STEP_SETTINGS = {"micro_batch": 3, "learning_rate": 1e-2}
"""Micro-batches of 3: the first batch (16 valid sequences) makes 6, 3 per rank; the second (8)
makes 3, so rank 0 runs two and rank 1 one (DistributedDataParallel's hooks could not)."""
MODES = {"full": {}, "lora": {"lora_rank": 4}}
"""Full fine-tuning, and LoRA (only the adapter's gradients are summed across the ranks)."""


def groups_for(trainer: Trainer) -> list[list[GradedGroup]]:
    """Two steps' batches; rank-independent (the same seeds, the same starting weights)."""
    first = [
        make_group(trainer, [1.0, 0.0, 0.5, 0.0, 1.0], seed=1),
        make_group(trainer, [0.0, 1.0, None, 1.0, 0.0], seed=2),
        make_group(trainer, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], seed=3),
    ]
    second = [
        make_group(trainer, [0.2, 0.9, 0.4, 0.0], seed=4),
        make_group(trainer, [1.0, 0.0, 1.0, 0.0], seed=5),
    ]
    return [first, second]


def _rank_main(rank: int, port: int, model_dir: str, checkpoint: str, out: str, mode: str) -> None:
    os.environ.update(
        WORLD_SIZE=str(WORLD),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    parallel = DataParallel.from_env(timeout_s=120)
    assert parallel is not None and parallel.rank == rank
    trainer = Trainer(model_dir, settings(**STEP_SETTINGS, **MODES[mode]), parallel=parallel)
    if parallel.leader:
        batches = groups_for(trainer)
        trainer.load_checkpoint(checkpoint)
        figures = [trainer.step(batch).as_dict() for batch in batches]
        trainer.close()
        torch.save({"weights": weights(trainer), "figures": figures}, f"{out}/rank0.pt")
    else:
        trainer.follow()
        torch.save({"weights": weights(trainer), "step": trainer.step_count}, f"{out}/rank1.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_train_exactly_like_one_process(
    model_dir: Path, tmp_path: Path, mode: str
) -> None:
    # one process: a checkpoint one step in (on other groups), then the two steps
    single = Trainer(model_dir, settings(**STEP_SETTINGS, **MODES[mode]))
    single.step([make_group(single, [1.0, 0.0, 0.0], seed=9)])
    checkpoint = single.save_checkpoint(tmp_path / "checkpoints")
    fresh = Trainer(model_dir, settings(**STEP_SETTINGS, **MODES[mode]))
    assert fresh.lora == (mode == "lora")
    batches = groups_for(fresh)
    fresh.load_checkpoint(checkpoint)
    expected = [fresh.step(batch) for batch in batches]

    mp.start_processes(
        _rank_main,
        args=(free_port(), str(model_dir), str(checkpoint), str(tmp_path), mode),
        nprocs=WORLD,
        start_method="spawn",
    )

    leader = torch.load(tmp_path / "rank0.pt", weights_only=False)
    follower = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert follower["step"] == fresh.step_count == 3  # the follower loaded and stepped too
    for name, value in leader["weights"].items():
        assert torch.equal(value, follower["weights"][name]), f"replicas differ at {name}"
        # summation order differs; Adam magnifies it where a gradient is near zero (lr 1e-2)
        torch.testing.assert_close(value, weights(fresh)[name], rtol=1e-4, atol=1e-5)
    for got, want in zip(leader["figures"], expected, strict=True):
        assert got["stepped"] and got["step"] == want.step
        assert got["sequences"] == want.sequences and got["tokens"] == want.tokens
        assert got["total_tokens"] == want.total_tokens
        for key in ("loss", "policy_loss", "clip_fraction", "ratio_mean", "grad_norm", "entropy"):
            assert abs(got[key] - getattr(want, key)) <= 1e-5 * max(1.0, abs(got[key])), key


def test_without_a_launcher_there_is_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert DataParallel.from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert DataParallel.from_env() is None
