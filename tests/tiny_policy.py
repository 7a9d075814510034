"""A tiny randomly initialised policy (no download) and synthetic graded groups, for the
trainer's tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from evoenv_learner.grpo import Role
from evoenv_learner.trainer import Trainer
from shared.config import GrpoSettings
from shared.messages import GeneratorGroupData, GradedCompletion, GradedGroup, SolverGroupData

VOCAB = 128


def write_tiny_model(folder: Path) -> Path:
    """A 2-layer Qwen2 with hidden size 32 and 128 tokens (tied embeddings), with a tokenizer."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    backend = Tokenizer(WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="t0", pad_token="t0"
    ).save_pretrained(folder)
    return folder


def settings(**overrides: float | int | str | bool) -> GrpoSettings:
    # float32 passes whatever the CPU: the tests compare log-probs and weights exactly
    base: dict[str, float | int | str | bool] = {
        "learning_rate": 1e-3,
        "micro_batch": 4,
        "temperature": 0.7,
        "compute_dtype": "float32",
    }
    base.update(overrides)
    return GrpoSettings.model_validate(base)


def make_group(
    trainer: Trainer,
    rewards: Sequence[float | None],
    *,
    role: Role = "solver",
    prompt: Sequence[int] = (1, 2, 3, 4, 5),
    seed: int = 0,
) -> GradedGroup:
    """A group of random completions whose behaviour log-probs are the trainer's own
    (on-policy); a None reward makes an env_error member."""
    rng = random.Random(seed)
    completions = []
    for reward in rewards:
        tokens = [rng.randrange(6, VOCAB) for _ in range(rng.randint(3, 8))]
        logprobs = trainer.completion_logprobs(prompt, tokens, role)
        completions.append(
            GradedCompletion(
                text=" ".join(f"t{t}" for t in tokens),
                prompt_token_ids=list(prompt),
                token_ids=tokens,
                logprobs=logprobs,
                finish_reason="stop",
                reward=reward,
                outcome="env_error" if reward is None else "scored",
            )
        )
    return GradedGroup(
        run="test",
        group_id=f"g{seed}",
        role=role,
        env_name="e",
        env_sha="0" * 64,
        seed=seed,
        difficulty=1,
        prompt="p",
        policy_version=0,
        completions=completions,
        data=(
            GeneratorGroupData(funnel=["admitted"] * len(completions), gamma=1.0)
            if role == "generator"
            else SolverGroupData()
        ),
    )


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in trainer.model.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def scored_pair(run: str, group_id: str, version: int) -> GradedGroup:
    """A solver group of two token-level completions scored 0 and 1 (a step trains on it),
    sampled at `version`, for an environment not in the pool."""
    completions = [
        GradedCompletion(
            text="x",
            prompt_token_ids=[1, 2],
            token_ids=[3, 4],
            logprobs=[-0.5, -0.5],
            policy_version=version,
            reward=reward,
            outcome="scored",
        )
        for reward in (0.0, 1.0)
    ]
    return GradedGroup(
        run=run,
        group_id=group_id,
        role="solver",
        env_name="e",
        env_sha="not-in-the-pool",
        seed=0,
        difficulty=1,
        prompt="p",
        policy_version=version,
        completions=completions,
    )
