"""The GRPO trainer on a tiny randomly initialised model (no download), synthetic groups."""

from __future__ import annotations

import errno
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_policy import make_group, same_weights, settings, weights
from transformers import (
    AutoModelForCausalLM,
)

from evoenv_learner import checkpoints as checkpoints_module
from evoenv_learner import trainer as trainer_module
from evoenv_learner.checkpoints import latest_checkpoint, list_checkpoints
from evoenv_learner.publisher import write_weights
from evoenv_learner.trainer import StepInterrupted, Trainer
from shared.errors import DiskFull
from shared.messages import GradedGroup


def sequence_logprob(trainer: Trainer, group: GradedGroup, index: int) -> float:
    completion = group.completions[index]
    return sum(trainer.completion_logprobs(completion.prompt_token_ids, completion.token_ids))


# ------------------------------------------------------------------------------- training


def test_step_raises_logprob_of_positive_completions_and_lowers_loss(model_dir: Path) -> None:
    trainer = Trainer(model_dir, settings())
    group = make_group(trainer, [1.0, 0.0, 0.0, 1.0])
    before = [sequence_logprob(trainer, group, i) for i in range(4)]

    first = trainer.step([group])
    after = [sequence_logprob(trainer, group, i) for i in range(4)]
    assert first.stepped and first.step == 1 and trainer.step_count == 1
    assert first.sequences == 4 and first.skipped_groups == 0
    assert first.tokens == sum(len(c.token_ids) for c in group.completions)
    assert first.total_tokens == first.tokens + 4 * 5
    assert first.ratio_mean == pytest.approx(1.0, abs=1e-4)  # on-policy: ratio 1
    assert first.clip_fraction == 0.0
    assert first.reward_mean == {"solver": 0.5} and first.reward_std == {"solver": 0.5}
    assert first.entropy > 0 and first.grad_norm > 0 and first.tokens_per_second > 0
    for i in (0, 3):  # advantage +1
        assert after[i] > before[i]
    for i in (1, 2):  # advantage -1
        assert after[i] < before[i]

    # the same batch again (behaviour log-probs unchanged): the loss went down
    second = trainer.step([group])
    assert second.loss < first.loss
    assert second.ratio_mean != pytest.approx(1.0, abs=1e-4)


def test_interrupt_abandons_the_step_between_micro_batches(model_dir: Path) -> None:
    trainer = Trainer(model_dir, settings(micro_batch=1))
    group = make_group(trainer, [1.0, 0.0, 0.0, 1.0])
    before = weights(trainer)
    calls = 0
    accumulate = trainer._accumulate

    def accumulate_then_interrupt(*args: object) -> None:  # a stop arriving mid-step
        nonlocal calls
        calls += 1
        accumulate(*args)  # type: ignore[arg-type]
        trainer.interrupt.set()

    trainer._accumulate = accumulate_then_interrupt  # type: ignore[method-assign]
    with pytest.raises(StepInterrupted, match="step 1 abandoned"):
        trainer.step([group])
    assert calls == 1 and trainer.step_count == 0
    assert same_weights(before, weights(trainer))
    assert all(p.grad is None for p in trainer.model.parameters())


def test_mixed_prompt_lengths_line_up_in_one_micro_batch(model_dir: Path) -> None:
    # groups with prompts of different lengths share a micro-batch; the new log-probs at the
    # training temperature match the behaviour ones exactly where they should (ratio 1)
    trainer = Trainer(model_dir, settings(micro_batch=8))
    groups = [
        make_group(trainer, [1.0, 0.0], prompt=(1, 2), seed=1),
        make_group(trainer, [0.0, 1.0, 0.5], prompt=(1, 2, 3, 4, 5, 6, 7, 8, 9), seed=2),
        make_group(trainer, [0.2, 0.9], role="generator", prompt=(7, 7, 7, 7), seed=3),
    ]
    metrics = trainer.step(groups)
    assert metrics.sequences == 7
    assert metrics.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert metrics.reward_mean["generator"] == pytest.approx(0.55)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_chunked_head_trains_exactly_like_whole_logits(
    model_dir: Path, checkpointing: bool
) -> None:
    # log-probs through the LM head a chunk at a time (the default for plain heads) give the
    # same step as whole logits: same metrics and same weights after it
    chunked = Trainer(model_dir, settings(micro_batch=8), gradient_checkpointing=checkpointing)
    whole = Trainer(model_dir, settings(micro_batch=8), gradient_checkpointing=checkpointing)
    assert chunked.chunked_head
    whole.chunked_head = False
    groups = [
        make_group(chunked, [1.0, 0.0, 0.5], prompt=(1, 2), seed=1),
        make_group(chunked, [0.2, 0.9], role="generator", prompt=(7, 7, 7, 7), seed=3),
    ]
    a, b = chunked.step(groups), whole.step(groups)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert a.entropy == pytest.approx(b.entropy, rel=1e-5)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    for name, tensor in weights(chunked).items():
        torch.testing.assert_close(tensor, weights(whole)[name], rtol=1e-4, atol=1e-6)


def test_env_error_completion_changes_nothing(model_dir: Path) -> None:
    plain = Trainer(model_dir, settings())
    with_error = Trainer(model_dir, settings())
    group = make_group(plain, [1.0, 0.0, 0.0, 1.0])
    error = make_group(plain, [None], seed=9).completions[0]
    error = error.model_copy(update={"logprobs": [-50.0] * len(error.token_ids)})
    noisy = group.model_copy(
        update={"completions": [*group.completions[:2], error, *group.completions[2:]]}
    )

    a = plain.step([group])
    b = with_error.step([noisy])
    assert b.env_error_completions == 1 and a.env_error_completions == 0
    assert a.sequences == b.sequences == 4
    assert a.loss == b.loss and a.tokens == b.tokens
    assert same_weights(weights(plain), weights(with_error))


def test_zero_variance_groups_are_skipped_and_counted(model_dir: Path) -> None:
    trainer = Trainer(model_dir, settings())
    start = weights(trainer)
    flat = [
        make_group(trainer, [1.0, 1.0, 1.0], seed=1),
        make_group(trainer, [0.0, None, 0.0], seed=2),
    ]
    metrics = trainer.step(flat)
    assert not metrics.stepped and metrics.skipped_groups == 2 and metrics.sequences == 0
    assert metrics.step == 0 and trainer.step_count == 0
    assert same_weights(start, weights(trainer))

    metrics = trainer.step([*flat, make_group(trainer, [1.0, 0.0], seed=3)])
    assert metrics.stepped and metrics.skipped_groups == 2 and metrics.sequences == 2


def test_gradient_accumulation_matches_one_big_batch(model_dir: Path) -> None:
    one = Trainer(model_dir, settings(micro_batch=8))
    many = Trainer(model_dir, settings(micro_batch=1))
    # plain SGD, so the weight change is the (clipped) gradient itself: Adam's first step
    # (about lr x sign(g)) would blow rounding noise in near-zero gradients up to lr
    for trainer in (one, many):
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    groups = [
        make_group(one, [1.0, 0.0, 0.5], seed=1),
        make_group(one, [0.0, 1.0], seed=2),
        make_group(one, [1.2, -0.5, -0.9], role="generator", seed=3),  # roles weighed apart
    ]
    a = one.step(groups)
    b = many.step(groups)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    wa, wb = weights(one), weights(many)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


class StepGradient(torch.optim.SGD):
    """An optimiser that keeps the gradient of the step and changes nothing."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, lr=0.0)
        self.seen = torch.zeros(0)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        params = self.param_groups[0]["params"]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        self.seen = torch.cat([g.flatten() for g in grads]).double()


def step_gradient(
    model_dir: Path, groups: list[GradedGroup], **overrides: int | float | bool
) -> torch.Tensor:
    """The gradient one real step over `groups` takes (micro-batches of 2 unless given,
    never clipped)."""
    given: dict[str, int | float | bool] = {"micro_batch": 2, "max_grad_norm": 1e9}
    trainer = Trainer(model_dir, settings(**{**given, **overrides}))
    recorder = StepGradient(trainer.trainable)
    trainer.optimizer = recorder
    trainer.step(groups)
    return recorder.seen


def lengthened(trainer: Trainer, group: GradedGroup) -> GradedGroup:
    """`group` with every completion written twice over (twice the tokens, on-policy)."""
    completions = []
    for c in group.completions:
        tokens = c.token_ids * 2
        logprobs = trainer.completion_logprobs(c.prompt_token_ids, tokens, group.role)
        completions.append(c.model_copy(update={"token_ids": tokens, "logprobs": logprobs}))
    return group.model_copy(update={"completions": completions})


def test_doubling_the_generators_lengths_leaves_its_share_of_the_gradient(
    model_dir: Path,
) -> None:
    """A step over a solver group S (3 answers) and a generator group G (4 files) takes
    alpha g_S + beta g_G, g_S and g_G the steps over S and G alone (each its role's token
    mean), solved for from the three real gradients. The generator's share beta / (alpha +
    beta) is its share of the sequences, 4/7, with G's files as written and twice as long;
    a token mean over the whole batch would give it its share of the tokens instead."""
    trainer = Trainer(model_dir, settings())
    solver = make_group(trainer, [1.0, 0.0, 0.5], seed=1)
    generator = make_group(trainer, [1.2, -0.5, -0.9, 0.4], role="generator", seed=2)
    longer = lengthened(trainer, generator)
    assert sum(len(c.token_ids) for c in longer.completions) == 2 * sum(
        len(c.token_ids) for c in generator.completions
    )
    g_solver = step_gradient(model_dir, [solver])
    shares = []
    for files in (generator, longer):
        g_files = step_gradient(model_dir, [files])
        mixed = step_gradient(model_dir, [solver, files])
        basis = torch.stack([g_solver, g_files], dim=1)
        coefficients = torch.linalg.lstsq(basis, mixed.unsqueeze(1)).solution.flatten()
        alpha, beta = coefficients.tolist()
        residual = torch.linalg.vector_norm(basis @ coefficients - mixed)
        assert residual <= 1e-4 * torch.linalg.vector_norm(mixed)  # exactly such a mix
        shares.append(beta / (alpha + beta))
    assert shares == pytest.approx([4 / 7, 4 / 7], rel=1e-4)


def test_micro_batches_are_padded_to_the_multiple_and_the_gradient_is_unchanged(
    model_dir: Path,
) -> None:
    """Every forward pass of a step sees a length that is a multiple of `pad_to_multiple`
    (a few shapes, whatever the completions' lengths), and the step's gradient and log-probs
    are those of the unpadded batch."""
    trainer = Trainer(model_dir, settings(micro_batch=2, pad_to_multiple=16))
    groups = [make_group(trainer, [1.0, 0.0, 0.5], seed=1), make_group(trainer, [0.0, 1.0], seed=3)]
    lengths: list[int] = []
    trainer.model.get_decoder().register_forward_pre_hook(
        lambda _module, _args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True,
    )
    metrics = trainer.step(groups)
    assert lengths and all(length % 16 == 0 for length in lengths)
    sequences = [c for g in groups for c in g.completions]
    assert metrics.total_tokens == sum(len(c.prompt_token_ids + c.token_ids) for c in sequences)

    padded = step_gradient(model_dir, groups, pad_to_multiple=16)
    unpadded = step_gradient(model_dir, groups, pad_to_multiple=1)
    torch.testing.assert_close(padded, unpadded, rtol=1e-4, atol=1e-6)
    completion = groups[0].completions[0]
    logprobs = {}
    for multiple in (1, 16):
        trainer.settings.pad_to_multiple = multiple
        logprobs[multiple] = trainer.completion_logprobs(
            completion.prompt_token_ids, completion.token_ids
        )
    assert len(logprobs[16]) == len(completion.token_ids)
    assert logprobs[16] == pytest.approx(logprobs[1], abs=1e-5)


def test_packed_micro_batches_take_the_unpacked_step(model_dir: Path) -> None:
    """With `pack`, each forward pass gets one row holding its micro-batch's sequences one
    after the other (no padding between them), and the step's gradient is the unpacked one's:
    every sequence attends only to itself, at its own positions and temperature."""
    trainer = Trainer(model_dir, settings(micro_batch=3, pack=True, pad_to_multiple=8))
    groups = [
        make_group(trainer, [1.0, 0.0, 0.5], seed=1),
        make_group(trainer, [0.0, 1.0], seed=3, role="generator", prompt=(9, 8, 7)),
        make_group(trainer, [0.2, 0.9, 0.0], seed=4, prompt=(3, 1, 4, 1, 5, 9, 2, 6)),
    ]
    shapes: list[tuple[int, int]] = []
    trainer.model.get_decoder().register_forward_pre_hook(
        lambda _module, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    trainer.step(groups)
    sequences = [len(c.prompt_token_ids + c.token_ids) for g in groups for c in g.completions]
    chunks = [sum(sequences[i : i + 3]) for i in range(0, len(sequences), 3)]
    assert shapes == [(1, -(-n // 8) * 8) for n in chunks]

    packed = step_gradient(model_dir, groups, pack=True, pad_to_multiple=8, micro_batch=3)
    unpacked = step_gradient(model_dir, groups, pad_to_multiple=1, micro_batch=1)
    torch.testing.assert_close(packed, unpacked, rtol=1e-4, atol=1e-6)


def test_kl_to_reference(model_dir: Path) -> None:
    trainer = Trainer(model_dir, settings(kl_coef=0.1))
    assert trainer.reference is not None
    group = make_group(trainer, [1.0, 0.0, 0.0, 1.0])
    first = trainer.step([group])
    assert first.kl == pytest.approx(0.0, abs=1e-7)  # still the reference's weights
    second = trainer.step([group])
    assert second.kl > 0


def test_mismatched_logprobs_are_refused(model_dir: Path) -> None:
    trainer = Trainer(model_dir, settings())
    group = make_group(trainer, [1.0, 0.0])
    bad = group.completions[0].model_copy(update={"logprobs": [-1.0]})
    with pytest.raises(ValueError, match="behaviour log-probs"):
        trainer.step([group.model_copy(update={"completions": [bad, group.completions[1]]})])


# ---------------------------------------------------------------------------- checkpoints


def optimizer_tensors(trainer: Trainer) -> list[torch.Tensor]:
    state = trainer.optimizer.state_dict()["state"]
    return [value for key in sorted(state) for value in state[key].values()]


def test_checkpoint_round_trip_is_exact(model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(model_dir, settings())
    groups = [make_group(trainer, [1.0, 0.0, 0.0, 1.0]), make_group(trainer, [0.3, 0.6], seed=5)]
    trainer.step(groups)
    trainer.step(groups)
    extra = {"policy_version": 7, "stream_id": "1700000000000-3", "pool": {"envs": ["a", "b"]}}
    path = trainer.save_checkpoint(tmp_path / "ckpt", extra)
    assert path.name == "step-00000002" and latest_checkpoint(tmp_path / "ckpt") == path
    expected_rand = torch.rand(3)
    expected_random = random.random()

    restored = Trainer(model_dir, settings())
    assert not same_weights(weights(trainer), weights(restored))
    assert restored.load_checkpoint(tmp_path / "ckpt") == extra
    assert restored.step_count == 2
    assert same_weights(weights(trainer), weights(restored))
    assert all(
        torch.equal(a, b)
        for a, b in zip(optimizer_tensors(trainer), optimizer_tensors(restored), strict=True)
    )
    assert torch.equal(torch.rand(3), expected_rand)  # RNG state restored
    assert random.random() == expected_random
    assert (path / "model" / "tokenizer.json").is_file()

    # and they go on identically
    trainer.step(groups)
    restored.step(groups)
    assert same_weights(weights(trainer), weights(restored))


def test_checkpoints_keep_the_last_n(model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(model_dir, settings())
    group = make_group(trainer, [1.0, 0.0])
    for _ in range(4):
        trainer.step([group])
        trainer.save_checkpoint(tmp_path, {"n": trainer.step_count}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_interrupted_checkpoint_leaves_no_partial_folder(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(model_dir, settings())
    group = make_group(trainer, [1.0, 0.0])
    trainer.step([group])
    good = trainer.save_checkpoint(tmp_path, {"version": 1})
    good_weights = weights(trainer)
    trainer.step([group])

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(trainer_module.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(tmp_path, {"version": 2})
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == [good]
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]  # no temp folder left

    # a writer killed outright (no cleanup) leaves a temp folder: ignored, then swept away
    partial = tmp_path / ".tmp-step-00000002-deadbeef"
    (partial / "model").mkdir(parents=True)
    (partial / "state.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == good
    fresh = Trainer(model_dir, settings())
    assert fresh.load_checkpoint(tmp_path) == {"version": 1}
    assert same_weights(good_weights, weights(fresh))
    fresh.save_checkpoint(tmp_path, {"version": 1})  # same step: replaces, sweeps the temp
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]


class _Usage:
    def __init__(self, free: int) -> None:
        self.total, self.used, self.free = 2 * free, free, free


def test_checkpoint_that_does_not_fit_is_refused_before_writing(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(model_dir, settings())
    group = make_group(trainer, [1.0, 0.0])
    trainer.step([group])
    good = trainer.save_checkpoint(tmp_path, {"version": 1})
    size = sum(f.stat().st_size for f in good.rglob("*") if f.is_file())
    needed = trainer.checkpoint_bytes()
    assert size <= needed <= size + 2**26  # the estimate is the real size, plus room
    trainer.step([group])

    monkeypatch.setattr(checkpoints_module.shutil, "disk_usage", lambda _: _Usage(size // 2))
    with pytest.raises(
        DiskFull, match=r"step-2 checkpoint in .*: needs about 33\.\d MB, 0\.\d MB free"
    ):
        trainer.save_checkpoint(tmp_path, {"version": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]


def test_disk_filling_up_mid_write_is_disk_full_and_leaves_no_folder(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(model_dir, settings())
    trainer.step([make_group(trainer, [1.0, 0.0])])

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer_module.torch, "save", full)
    with pytest.raises(DiskFull, match="the disk filled up while writing"):
        trainer.save_checkpoint(tmp_path, {"version": 1})
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(checkpoints_module.shutil, "disk_usage", lambda _: _Usage(16))
    with pytest.raises(DiskFull, match="pushed weights"):
        write_weights(trainer.model, tmp_path / "push" / "v00000001", torch.bfloat16)
    assert not (tmp_path / "push" / "v00000001").exists()


def test_load_from_empty_root_fails(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Trainer(model_dir, settings()).load_checkpoint(tmp_path)


# ------------------------------------------------------------------------------- exports


def test_export_hf_and_push_folder(model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer(model_dir, settings())
    trainer.step([make_group(trainer, [1.0, 0.0])])
    exported = trainer.export_hf(tmp_path / "export", dtype=torch.bfloat16)
    config = json.loads((exported / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert (exported / "tokenizer.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    own = trainer.model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, own[name].to(torch.bfloat16).float()), name

    pushed = trainer.save_weights_for_push(tmp_path / "push")
    assert (pushed / "config.json").is_file() and list(pushed.glob("*.safetensors"))
    assert not (pushed / "tokenizer.json").exists()
    again = trainer.save_weights_for_push(tmp_path / "push")  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "push"] and again == pushed
