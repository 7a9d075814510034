"""The trainer's log-probs score the tokens they are said to score: checked against a forward
pass written here, and against the log-probs vLLM returned for a real completion.

The trainer's own tests give it behaviour log-probs that it computed itself, so log-probs one
token off (each completion token scored by the wrong position) would pass them; the two
computations here share no code with the trainer.

Both load the 135M model as the learner does, and the second starts a vLLM server: `slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_support import ServeProcess, model_settings
from transformers import AutoModelForCausalLM, AutoTokenizer

from evoenv_learner.grpo import Role
from evoenv_learner.trainer import Trainer, TrainSequence, _collate
from evoenv_model.models import TEST_MODEL
from evoenv_model.serve import VllmServer
from shared.config import GrpoSettings
from shared.inference import InferenceClient, Sampling

pytestmark = pytest.mark.slow

CHATS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Write a Python function that reverses a string.", "def reverse(s):\n    return s[::-1]"),
    ("What is 17 times 23? Answer in one line.", "17 times 23 is 391."),
]
ROLES: list[Role] = ["solver", "generator", "solver"]


@pytest.fixture(scope="module")
def trainer(small_model: Path) -> Trainer:
    """The small model as the learner loads it (float32 master weights): the solver trained at
    temperature 1.0, the generator at 0.7."""
    settings = GrpoSettings.model_validate(
        {"temperature": 1.0, "generator_temperature": 0.7, "compute_dtype": "float32"}
    )
    return Trainer(small_model, settings, device="cpu")


@pytest.fixture(scope="module")
def chats(trainer: Trainer, small_model: Path) -> list[tuple[TrainSequence, Role, torch.Tensor]]:
    """Each chat as a sequence at its role's temperature, with the log-probs of its completion
    tokens by plain transformers (prompts and completions of different lengths)."""
    tokenizer = AutoTokenizer.from_pretrained(small_model)
    model = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.float32).eval()
    out = []
    for (question, answer), role in zip(CHATS, ROLES, strict=True):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        completion = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        temperature = trainer.temperatures[role]
        seq = TrainSequence(list(prompt), completion, [0.0] * len(completion), 0.0, temperature)
        out.append((seq, role, _reference_logprobs(model, seq.prompt, completion, temperature)))
    return out


def _reference_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax over the whole vocabulary of the logits at the positions that predict each
    completion token (position p predicts token p + 1), one unpadded sequence at a time."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    scaled = logits[len(prompt) - 1 : -1] / temperature
    targets = torch.tensor(completion)[:, None]
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets).squeeze(-1)


@pytest.mark.parametrize("chunked_head", [True, False], ids=["chunked-head", "whole-logits"])
def test_trainer_logprobs_equal_an_independent_forward_pass(
    trainer: Trainer,
    chats: list[tuple[TrainSequence, Role, torch.Tensor]],
    chunked_head: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ways the trainer computes log-probs (one completion; a right-padded micro-batch of
    prompts and completions of different lengths at two temperatures, as a training step
    does) agree with plain transformers, by either LM-head path. Both are float32 on the same
    weights; only the order of the arithmetic differs (padding, logits kept, chunked head).
    Measured on an AMD EPYC: at most 1.5e-5 (mean 5e-6); log-probs one token off differ by
    tenths of a nat or more. Tolerance: 1e-4."""
    monkeypatch.setattr(trainer, "chunked_head", chunked_head)
    for seq, role, expected in chats:
        single = trainer.completion_logprobs(seq.prompt, seq.completion, role)
        torch.testing.assert_close(torch.tensor(single), expected, rtol=0, atol=1e-4)

    batch = _collate([seq for seq, _, _ in chats], trainer.device)
    with torch.no_grad():
        batched, _ = trainer._logprobs(trainer.model, batch)
    for row, (_, _, expected) in enumerate(chats):
        torch.testing.assert_close(batched[row][batch.mask[row]], expected, rtol=0, atol=1e-4)


# Float32 is the session server's dtype (`vllm_server`); bfloat16 is `evoenv serve`'s process
# (`serve_process`), which the SIGKILL test (`test_serve_process.py`, after this module) kills.
TOLERANCE = {"bfloat16": (0.15, 1.0), "float32": (1e-4, 1e-3)}
"""Largest mean and largest max absolute difference, in nats, between the trainer's
log-probs and the server's, by the server's dtype."""


@pytest.fixture(params=sorted(TOLERANCE))
def served(
    request: pytest.FixtureRequest, vllm_server: VllmServer, serve_process: ServeProcess
) -> tuple[str, str]:
    """(dtype, the URL of a server of the small model in that dtype). The session server is
    asked for first either way: `evoenv serve` starts beside it (`vllm_server`)."""
    dtype: str = request.param
    assert model_settings().serve.dtype == "float32"
    if dtype == "float32":
        return dtype, vllm_server.url
    serve_process.running()
    return dtype, serve_process.url


@pytest.mark.integration
def test_trainer_logprobs_match_those_vllm_sampled_with(
    trainer: Trainer, served: tuple[str, str]
) -> None:
    """Real completions sampled at the generator's temperature (0.7) through the project's
    client: the trainer's float32 log-probs of their tokens against the ones the server
    returned (`processed_logprobs`: after temperature), with the server in each dtype.

    Measured on an AMD EPYC with AVX512-BF16 and no AMX (vLLM's CPU build 0.32), this request
    with seeds 0 to 7 (37 to 91 tokens each): the server in float32, mean 3e-6 to 8e-6 and max
    2e-5 to 5e-5 nats (the same weights, other kernels); in bfloat16, mean 0.027 to 0.050 and
    max 0.10 to 0.39 (seed 0: 0.041 and 0.25), as bfloat16 activations keep 3 significant
    digits. Tolerances (mean, max): float32 1e-4 and 1e-3, bfloat16 0.15 and 1.0, at least 2.5
    times what was measured; log-probs one token off differ by nats. A CPU without
    AVX512-BF16 runs other bfloat16 kernels and may need figures of its own."""
    dtype, url = served
    with InferenceClient([url], TEST_MODEL) as client:
        completions = client.chat(
            [{"role": "user", "content": CHATS[0][0]}],
            Sampling(max_tokens=48, temperature=trainer.temperatures["generator"], n=2, seed=0),
        )
    differences = torch.cat(
        [
            (
                torch.tensor(
                    trainer.completion_logprobs(c.prompt_token_ids, c.token_ids, "generator")
                )
                - torch.tensor(c.logprobs)
            ).abs()
            for c in completions
        ]
    )
    mean, largest = TOLERANCE[dtype]
    assert differences.numel() >= 20
    assert differences.mean().item() < mean, (dtype, differences.mean().item())
    assert differences.max().item() < largest, (dtype, differences.max().item())
