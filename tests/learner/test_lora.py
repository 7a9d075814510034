"""The trainer's LoRA mode (`EVOENV_GRPO__LORA_RANK` > 0, `evoenv_learner/lora.py`) on the tiny
randomly initialised policy: only the adapter trains, checkpoints and pushes hold the adapter,
exports are merged, and the KL reference is the base with the adapter switched off."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from tiny_policy import make_group, same_weights, settings, weights
from transformers import AutoModelForCausalLM

from evoenv_learner.trainer import Trainer
from shared.errors import UsageError
from shared.messages import GradedGroup

RANK = 4
LORA = {"lora_rank": RANK, "learning_rate": 1e-2}
"""A learning rate large enough that two steps move the logits visibly (>1e-3)."""
PEFT_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.\d\.(self_attn|mlp)\.\w+_proj\.lora_[AB]\.weight$"
)
"""peft's standard adapter key, which vLLM's LoRA loader parses: no adapter name in it."""
IDS = torch.tensor([[1, 2, 3, 4, 5, 17, 33, 90, 64, 7]])
BF16_EXPORT_ATOL = 5e-3
"""A bfloat16 export's logits against the adapter's: measured 1.2e-3 here (logits up to 0.5;
the base model without the adapter is 0.54 away); a float32 export's: 1e-4."""


def lora_trainer(model_dir: Path, **overrides: float | int | str) -> Trainer:
    return Trainer(model_dir, settings(**{**LORA, **overrides}))


def groups_for(trainer: Trainer) -> list[GradedGroup]:
    return [make_group(trainer, [1.0, 0.0, 0.0, 1.0]), make_group(trainer, [0.3, 0.6], seed=5)]


def base_and_adapter(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    every = weights(trainer)
    adapter = {name: t for name, t in every.items() if "lora_" in name}
    return {name: t for name, t in every.items() if name not in adapter}, adapter


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(input_ids=IDS, use_cache=False).logits.float()


def adapter_parameters(rank: int, layers: int = 2) -> int:
    """rank x (in + out) per projection of the tiny Qwen2 (hidden 32, MLP 64, 4 heads of 8,
    2 key/value heads), over every layer."""
    shapes = {"q": (32, 32), "k": (32, 16), "v": (32, 16), "o": (32, 32)}
    shapes |= {"gate": (32, 64), "up": (32, 64), "down": (64, 32)}
    return layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in shapes.values())


# ------------------------------------------------------------------------------- training


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_step_trains_the_adapter_and_leaves_the_base_bit_identical(
    model_dir: Path, checkpointing: bool
) -> None:
    trainer = Trainer(model_dir, settings(**LORA), gradient_checkpointing=checkpointing)
    assert trainer.lora and trainer.reference is None
    assert sum(p.numel() for p in trainer.trainable) == adapter_parameters(RANK) == 4096
    trainable_names = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert len(trainable_names) == 2 * 7 * 2 and all(".lora_" in n for n in trainable_names)
    assert trainer.optimizer.param_groups[0]["params"] == trainer.trainable
    group = make_group(trainer, [1.0, 0.0, 0.0, 1.0])
    positive = group.completions[0]
    before = sum(trainer.completion_logprobs(positive.prompt_token_ids, positive.token_ids))
    base, adapter = base_and_adapter(trainer)

    first = trainer.step([group])
    second = trainer.step([group])
    assert first.stepped and second.stepped and first.grad_norm > 0
    after_base, after_adapter = base_and_adapter(trainer)
    assert same_weights(base, after_base)  # the frozen base, bit for bit
    # B starts at zero, so the first step moves only B; by the second every tensor has moved
    assert all(not torch.equal(adapter[name], after_adapter[name]) for name in adapter)
    after = sum(trainer.completion_logprobs(positive.prompt_token_ids, positive.token_ids))
    assert after > before  # the loss reached the adapter through the (checkpointed) passes
    assert second.loss < first.loss


def test_chunked_head_and_whole_logits_train_the_adapter_alike(model_dir: Path) -> None:
    # the chunked LM head reaches the decoder through peft's wrapper (`get_decoder`); whole
    # logits go through peft's forward: the same steps, KL term included
    chunked = lora_trainer(model_dir, micro_batch=8, kl_coef=0.05)
    whole = lora_trainer(model_dir, micro_batch=8, kl_coef=0.05)
    assert chunked.chunked_head
    whole.chunked_head = False
    groups = groups_for(chunked)
    for _ in range(2):
        a, b = chunked.step(groups), whole.step(groups)
        assert a.loss == pytest.approx(b.loss, abs=1e-6)
        assert a.kl == pytest.approx(b.kl, rel=1e-4, abs=1e-9)
    assert a.kl > 0
    # summation order differs; Adam magnifies it where a gradient is near zero (lr 1e-2)
    for name, tensor in weights(chunked).items():
        torch.testing.assert_close(tensor, weights(whole)[name], rtol=1e-4, atol=1e-5)


def test_kl_reference_is_the_base_with_the_adapter_off_not_a_second_model(
    model_dir: Path,
) -> None:
    trainer = lora_trainer(model_dir, kl_coef=0.1)
    assert trainer.reference is None  # no second copy of the weights
    assert sum(p.numel() for p in trainer.model.parameters()) == sum(
        p.numel() for p in Trainer(model_dir, settings()).model.parameters()
    ) + adapter_parameters(RANK)
    group = make_group(trainer, [1.0, 0.0, 0.0, 1.0])
    first = trainer.step([group])
    assert first.kl == 0.0  # B is zero: the adapter changes nothing yet
    second = trainer.step([group])
    assert second.kl > 1e-6

    # the reference log-probs are the base model's, and switching the adapter off and on
    # again leaves it trainable
    full = Trainer(model_dir, settings())
    completion = group.completions[1]
    with trainer.model.disable_adapter():
        reference = trainer.completion_logprobs(completion.prompt_token_ids, completion.token_ids)
    base = full.completion_logprobs(completion.prompt_token_ids, completion.token_ids)
    assert reference == pytest.approx(base, abs=1e-6)
    assert all(p.requires_grad for p in trainer.trainable)
    assert trainer.step([group]).stepped


# ---------------------------------------------------------------------------- checkpoints


def optimizer_tensors(trainer: Trainer) -> list[torch.Tensor]:
    state = trainer.optimizer.state_dict()["state"]
    return [value for key in sorted(state) for value in state[key].values()]


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_checkpoint_holds_the_adapter_only_and_round_trips(model_dir: Path, tmp_path: Path) -> None:
    trainer = lora_trainer(model_dir)
    groups = groups_for(trainer)
    trainer.step(groups)
    trainer.step(groups)
    path = trainer.save_checkpoint(tmp_path / "lora", {"policy_version": 7})
    expected_rand = torch.rand(3)
    expected_random = random.random()

    assert sorted(p.name for p in path.iterdir()) == [
        "adapter",
        "optimizer.pt",
        "rng.pt",
        "state.json",
    ]
    state = json.loads((path / "state.json").read_text())
    assert state["mode"] == "lora" and state["lora"]["rank"] == RANK
    assert state["lora"]["alpha"] == 32 and len(state["lora"]["target_modules"]) == 7
    saved = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    assert len(saved) == 28 and all(PEFT_KEY.match(name) for name in saved)
    assert all(t.dtype == torch.float32 for t in saved.values())
    size = folder_bytes(path)
    assert size <= trainer.checkpoint_bytes() <= size + 2**20  # the estimate, plus room
    assert list(path.rglob("*.safetensors")) == [path / "adapter" / "adapter_model.safetensors"]
    full = Trainer(model_dir, settings())
    full.step(groups_for(full))
    full_size = folder_bytes(full.save_checkpoint(tmp_path / "full"))
    # no base weights: on the tiny model they are only 5.6x the adapter (on the 0.5B model,
    # rank 16, 250x), and torch.save and the RNG state add ~50 kB either way
    assert size < full_size / 3

    restored = lora_trainer(model_dir)
    assert not same_weights(weights(trainer), weights(restored))
    assert restored.load_checkpoint(tmp_path / "lora") == {"policy_version": 7}
    assert restored.step_count == 2
    assert same_weights(weights(trainer), weights(restored))
    assert all(
        torch.equal(a, b)
        for a, b in zip(optimizer_tensors(trainer), optimizer_tensors(restored), strict=True)
    )
    assert torch.equal(torch.rand(3), expected_rand) and random.random() == expected_random

    # and the next step is the same step
    a, b = trainer.step(groups), restored.step(groups)
    assert a.loss == b.loss and a.grad_norm == b.grad_norm and a.step == b.step == 3
    assert same_weights(weights(trainer), weights(restored))


def test_checkpoint_of_the_other_mode_is_refused_in_one_line(
    model_dir: Path, tmp_path: Path
) -> None:
    full = Trainer(model_dir, settings())
    full.step([make_group(full, [1.0, 0.0])])
    full_path = full.save_checkpoint(tmp_path / "full")
    lora = lora_trainer(model_dir)
    lora.step([make_group(lora, [1.0, 0.0])])
    lora_path = lora.save_checkpoint(tmp_path / "lora")

    fresh = lora_trainer(model_dir)
    untouched = weights(fresh)
    with pytest.raises(UsageError) as refused:
        fresh.load_checkpoint(tmp_path / "full")
    assert str(refused.value) == (
        "checkpoint step-00000001 was written in full fine-tuning mode; resume it with "
        "EVOENV_GRPO__LORA_RANK=0, or start a new run folder"
    )
    assert fresh.step_count == 0 and same_weights(untouched, weights(fresh))

    with pytest.raises(UsageError) as refused:
        Trainer(model_dir, settings()).load_checkpoint(lora_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("checkpoint step-00000001 holds a LoRA adapter of rank 4, alpha 32")
    assert message.endswith("resume it with EVOENV_GRPO__LORA_RANK=4, or start a new run folder")

    targets = json.dumps(sorted(settings().lora_target_modules))
    fixes = (
        "EVOENV_GRPO__LORA_RANK=4 EVOENV_GRPO__LORA_ALPHA=32 "
        f"EVOENV_GRPO__LORA_TARGET_MODULES='{targets}'"
    )
    with pytest.raises(UsageError, match=re.escape(f"resume it with {fixes}, or start a new")):
        lora_trainer(
            model_dir, lora_rank=8, lora_alpha=16, lora_target_modules=["q_proj"]
        ).load_checkpoint(lora_path)
    # the dropout does not change the adapter's shape: resumable
    assert lora_trainer(model_dir, lora_dropout=0.1).load_checkpoint(lora_path) == {}

    # a checkpoint from before the mode was recorded is a full one
    state = json.loads((full_path / "state.json").read_text())
    del state["mode"]
    (full_path / "state.json").write_text(json.dumps(state))
    assert Trainer(model_dir, settings()).load_checkpoint(full_path) == {}
    with pytest.raises(UsageError, match="written in full fine-tuning mode"):
        lora_trainer(model_dir).load_checkpoint(full_path)


# ------------------------------------------------------------------------- pushes, exports


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_pushed_adapter_is_peft_layout_in_the_servers_dtype(
    model_dir: Path, tmp_path: Path, dtype: torch.dtype
) -> None:
    trainer = lora_trainer(model_dir)
    groups = groups_for(trainer)
    trainer.step(groups)
    trainer.step(groups)
    folder = trainer.save_adapter_for_push(tmp_path / "push", dtype=dtype)
    assert folder == tmp_path / "push"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in folder.iterdir()
    }
    assert [p.name for p in tmp_path.iterdir()] == ["push"]  # no temporary folder left
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in folder.iterdir())  # others read
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == 32 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == str(model_dir)
    assert sorted(config["target_modules"]) == sorted(settings().lora_target_modules)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == 28 and all(PEFT_KEY.match(name) for name in tensors)
    assert all(t.dtype == dtype for t in tensors.values())
    own = dict(trainer.model.named_parameters())
    for name, tensor in tensors.items():
        trained = own[name.replace(".weight", ".default.weight")]
        assert torch.equal(tensor, trained.detach().to(dtype)), name
    assert trainer.adapter_bytes(dtype) == sum(
        t.numel() * t.element_size() for t in tensors.values()
    )

    if dtype == torch.float32:  # what peft loads on the base is the trainer's policy
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        base_logits = logits(base)
        loaded = PeftModel.from_pretrained(base, str(folder)).eval()
        ours = logits(trainer.model)
        assert (ours - base_logits).abs().max() > 1e-3  # the adapter matters
        torch.testing.assert_close(logits(loaded), ours, rtol=0, atol=1e-6)


def test_full_weights_push_is_refused_in_lora_mode_and_adapter_push_in_full(
    model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="push it with save_adapter_for_push"):
        lora_trainer(model_dir).save_weights_for_push(tmp_path / "push")
    with pytest.raises(UsageError, match="needs a LoRA trainer"):
        Trainer(model_dir, settings()).save_adapter_for_push(tmp_path / "push")
    assert list(tmp_path.iterdir()) == []


def test_export_hf_writes_merged_weights_and_training_goes_on(
    model_dir: Path, tmp_path: Path
) -> None:
    trainer = lora_trainer(model_dir)
    groups = groups_for(trainer)
    trainer.step(groups)
    trainer.step(groups)
    before = logits(trainer.model)

    exported = trainer.export_hf(tmp_path / "export")
    assert json.loads((exported / "config.json").read_text())["dtype"] == "float32"
    assert (exported / "tokenizer.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(exported)
    assert not any("lora" in name for name in merged.state_dict())
    # W + (alpha / r) B A in one matrix against the two paths summed: float32 rounding only
    torch.testing.assert_close(logits(merged), before, rtol=0, atol=1e-4)
    assert (logits(AutoModelForCausalLM.from_pretrained(model_dir)) - before).abs().max() > 1e-3
    # In bfloat16 (the embedded model's dtype, so its exports' default) the merged weights
    # keep 8 significant bits: logits within BF16_EXPORT_ATOL of the adapter's, the greedy
    # token at every position the same.
    exported16 = trainer.export_hf(tmp_path / "export-bf16", dtype=torch.bfloat16)
    merged16 = AutoModelForCausalLM.from_pretrained(exported16, dtype=torch.float32)
    torch.testing.assert_close(logits(merged16), before, rtol=0, atol=BF16_EXPORT_ATOL)
    assert torch.equal(logits(merged16).argmax(-1), before.argmax(-1))

    # the training model kept its adapter, unmerged, and trains on
    assert torch.equal(logits(trainer.model), before)
    base, adapter = base_and_adapter(trainer)
    assert len(adapter) == 28
    assert trainer.step(groups).stepped
    after_base, after_adapter = base_and_adapter(trainer)
    assert same_weights(base, after_base) and not same_weights(adapter, after_adapter)


def test_gradient_checkpointing_is_on_in_full_fine_tuning_and_off_with_lora_unless_set(
    model_dir: Path,
) -> None:
    assert Trainer(model_dir, settings()).model.is_gradient_checkpointing
    assert not Trainer(model_dir, settings(**LORA)).model.is_gradient_checkpointing
    forced = Trainer(model_dir, settings(**LORA, gradient_checkpointing=True))
    assert forced.model.is_gradient_checkpointing
