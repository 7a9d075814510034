"""Sharded data-parallel training (`distributed.py`, FSDP2): two real processes joined by gloo,
as torchrun starts them, take the same steps as one process, each holding half the weights and
half of AdamW's state, and a run resumed from its sharded checkpoint goes on with the same
weights."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from support import free_port
from tiny_policy import make_group, settings, weights
from torch.distributed.tensor import DTensor

from evoenv_cli.up import learner_argv
from evoenv_learner.distributed import DataParallel
from evoenv_learner.trainer import Trainer
from shared.errors import UsageError
from shared.messages import GradedGroup

WORLD = 2
STEP_SETTINGS = {"micro_batch": 3, "learning_rate": 1e-2}
"""Micro-batches of 3: the first batch (16 valid sequences) makes 6, 3 per rank; the second (8)
makes 3, so rank 0 runs two and rank 1 one and an empty one (FSDP2's collectives need as many
passes on every rank)."""


def batches_for(trainer: Trainer) -> list[list[GradedGroup]]:
    """Three steps' batches (on-policy log-probs of the starting weights)."""
    first = [
        make_group(trainer, [1.0, 0.0, 0.5, 0.0, 1.0], seed=1),
        make_group(trainer, [0.0, 1.0, None, 1.0, 0.0], seed=2),
        make_group(trainer, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], seed=3),
    ]
    second = [
        make_group(trainer, [0.2, 0.9, 0.4, 0.0], seed=4),
        make_group(trainer, [1.0, 0.0, 1.0, 0.0], seed=5),
    ]
    third = [make_group(trainer, [1.0, 0.0, 0.0], seed=9)]
    return [first, second, third]


def local_numel(tensors: list[torch.Tensor]) -> int:
    """Elements this process holds of `tensors` (a DTensor's shard, a plain tensor whole)."""
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors)


def holdings(trainer: Trainer) -> dict[str, int]:
    params = list(trainer.model.parameters())
    moments = [
        value
        for state in trainer.optimizer.state.values()
        for key, value in state.items()
        if key in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "params": local_numel(params),
        "params_whole": sum(p.numel() for p in params),
        "moments": local_numel(moments),
        "moments_whole": sum(m.numel() for m in moments),
    }


def _rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
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
    with pytest.raises(UsageError, match="LoRA trains in one process"):
        Trainer(model_dir, settings(**STEP_SETTINGS, lora_rank=4), parallel=parallel)
    batches = torch.load(f"{out}/batches.pt", weights_only=False)
    trainer = Trainer(model_dir, settings(**STEP_SETTINGS), parallel=parallel)
    if not parallel.leader:
        trainer.follow()  # the run, then the resumed run
        resumed = Trainer(model_dir, settings(**STEP_SETTINGS), parallel=parallel)
        resumed.follow()
        torch.save(holdings(trainer), f"{out}/holdings{rank}.pt")
        torch.distributed.destroy_process_group()
        return
    figures = [trainer.step(batches[0]).as_dict()]
    checkpoint = trainer.save_checkpoint(Path(out) / "sharded")
    figures += [trainer.step(batch).as_dict() for batch in batches[1:]]
    trainer.export_hf(Path(out) / "export")
    run = trainer.weights_for_push()
    with pytest.raises(UsageError, match="written by one process"):
        trainer.load_checkpoint(Path(out) / "single")
    trainer.close()
    resumed = Trainer(model_dir, settings(**STEP_SETTINGS), parallel=parallel)
    resumed.load_checkpoint(checkpoint)
    for batch in batches[1:]:
        resumed.step(batch)
    again = resumed.weights_for_push()
    resumed.close()
    torch.save(
        {
            "figures": figures,
            "weights": run,
            "resumed": again,
            "step": resumed.step_count,
            "holdings": holdings(trainer),
        },
        f"{out}/rank0.pt",
    )
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One process's three steps (and its checkpoint after the first), then the same three
    steps on two ranks, a checkpoint after the first, and a second group of two ranks that
    resumes from it."""
    out = tmp_path_factory.mktemp("sharded")
    single = Trainer(model_dir, settings(**STEP_SETTINGS))
    batches = batches_for(single)
    torch.save(batches, out / "batches.pt")
    expected = [single.step(batches[0])]
    single.save_checkpoint(out / "single")
    expected += [single.step(batch) for batch in batches[1:]]
    mp.start_processes(
        _rank_main,
        args=(free_port(), str(model_dir), str(out)),
        nprocs=WORLD,
        start_method="spawn",
    )
    leader = torch.load(out / "rank0.pt", weights_only=False)
    return {
        "out": out,
        "expected": expected,
        "single": weights(single),
        "leader": leader,
        "follower": torch.load(out / "holdings1.pt", weights_only=False),
    }


def assert_close_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys() - {"lm_head.weight"}  # tied to the embeddings: once
    for name, value in got.items():
        # summation order differs; Adam magnifies it where a gradient is near zero (lr 1e-2)
        torch.testing.assert_close(value, want[name], rtol=1e-4, atol=1e-5)


def test_two_ranks_take_the_same_steps_as_one_process(sharded_run: dict) -> None:
    assert_close_weights(sharded_run["leader"]["weights"], sharded_run["single"])
    for got, want in zip(sharded_run["leader"]["figures"], sharded_run["expected"], strict=True):
        assert got["stepped"] and got["step"] == want.step
        assert got["sequences"] == want.sequences and got["tokens"] == want.tokens
        assert got["total_tokens"] == want.total_tokens
        for key in ("loss", "policy_loss", "clip_fraction", "ratio_mean", "grad_norm", "entropy"):
            assert abs(got[key] - getattr(want, key)) <= 1e-5 * max(1.0, abs(got[key])), key


def test_each_rank_holds_half_the_weights_and_half_the_optimiser_state(
    sharded_run: dict,
) -> None:
    for held in (sharded_run["leader"]["holdings"], sharded_run["follower"]):
        assert held["moments_whole"] == 2 * held["params_whole"] > 0  # exp_avg, exp_avg_sq
        # dim-0 shards: a tensor of odd length leaves one rank a row more
        assert abs(held["params"] - held["params_whole"] / WORLD) <= 0.02 * held["params_whole"]
        assert abs(held["moments"] - held["moments_whole"] / WORLD) <= 0.02 * held["moments_whole"]


def test_a_resumed_sharded_run_continues_with_the_same_weights(sharded_run: dict) -> None:
    leader = sharded_run["leader"]
    assert leader["step"] == 3
    for name, value in leader["resumed"].items():
        torch.testing.assert_close(value, leader["weights"][name], rtol=1e-5, atol=1e-6)


def test_one_process_loads_a_sharded_checkpoint_and_an_export_is_one_folder(
    sharded_run: dict, model_dir: Path
) -> None:
    out = sharded_run["out"]
    (checkpoint,) = (out / "sharded").glob("step-*")
    assert (checkpoint / "shards").is_dir() and not (checkpoint / "model").exists()
    single = Trainer(model_dir, settings(**STEP_SETTINGS))
    single.load_checkpoint(checkpoint)
    batches = torch.load(out / "batches.pt", weights_only=False)
    for batch in batches[1:]:
        single.step(batch)
    assert single.step_count == 3
    assert_close_weights(
        {k: v for k, v in weights(single).items() if k != "lm_head.weight"},
        sharded_run["single"],
    )
    exported = Trainer(out / "export", settings(**STEP_SETTINGS))
    assert_close_weights(
        {k: v for k, v in weights(exported).items() if k != "lm_head.weight"},
        sharded_run["single"],
    )


def test_without_a_launcher_there_is_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert DataParallel.from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert DataParallel.from_env() is None


def test_up_starts_a_learner_of_several_ranks_through_torchrun() -> None:
    argv = learner_argv(2, steps=5)
    assert argv[-5:] == ["-v", "learner", "--resume", "--steps", "5"]
    assert "--nproc_per_node=2" in argv and learner_argv(1, None)[-3:] == [
        "-v",
        "learner",
        "--resume",
    ]
    # the same launch with `--help` for the learner's arguments: both ranks run the command
    ran = subprocess.run(
        [*argv[:-5], "--help"], capture_output=True, text=True, timeout=300, check=True
    )
    assert ran.stdout.count("Usage: evoenv") == 2, ran.stdout + ran.stderr
