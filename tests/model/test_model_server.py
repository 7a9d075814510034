"""The real server on the small model: coherent answers, token ids and sampled log-probs."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from evoenv_model.serve import VllmServer
from shared.inference import InferenceClient, Sampling

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = Sampling(max_tokens=32, temperature=0.0)


def test_chat_answer_is_coherent_and_its_tokens_decode_to_the_text(
    vllm_server: VllmServer, small_model: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(small_model)
    with InferenceClient([vllm_server.url], "smollm2-135m-instruct") as client:
        client.wait_ready(timeout=10)
        (answer,) = client.chat(QUESTION, GREEDY)
    assert "Paris" in answer.text
    assert answer.finish_reason == "stop"
    assert tokenizer.decode(answer.token_ids, skip_special_tokens=True) == answer.text
    assert answer.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tokenizer.decode(answer.prompt_token_ids)
    assert prompt.endswith("What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert len(answer.logprobs) == len(answer.token_ids)
    assert all(math.isfinite(x) and x <= 0.0 for x in answer.logprobs)


def test_both_routes_give_the_same_completion(vllm_server: VllmServer) -> None:
    with InferenceClient([vllm_server.url], "smollm2-135m-instruct") as client:
        (tokens,) = client.complete(
            "The capital of France is", Sampling(max_tokens=8, temperature=0)
        )
        client._balancer.routes[vllm_server.url] = "openai"
        (openai,) = client.complete(
            "The capital of France is", Sampling(max_tokens=8, temperature=0)
        )
    assert (tokens.text, tokens.token_ids) == (openai.text, openai.token_ids)
    assert tokens.prompt_token_ids == openai.prompt_token_ids
    assert tokens.logprobs == pytest.approx(openai.logprobs, abs=1e-4)
    assert tokens.finish_reason == "length" and len(tokens.token_ids) == 8


def test_logprobs_are_those_of_the_distribution_sampled_from(vllm_server: VllmServer) -> None:
    """top_k=1 leaves one token with probability 1: processed log-probs are all 0 (raw are not)."""
    with InferenceClient([vllm_server.url], "smollm2-135m-instruct") as client:
        (only,) = client.chat(QUESTION, Sampling(max_tokens=12, temperature=1.0, top_k=1))
        (free,) = client.chat(QUESTION, Sampling(max_tokens=12, temperature=0.0))
    assert only.logprobs == [0.0] * len(only.token_ids)
    assert only.token_ids == free.token_ids[: len(only.token_ids)]
    assert min(free.logprobs) < -1e-3


def test_structured_output_follows_the_schema(vllm_server: VllmServer) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["accept", "reject"]}},
        "required": ["verdict"],
        "additionalProperties": False,
    }
    sampling = Sampling(max_tokens=40, temperature=1.0, n=4, seed=0, json_schema=schema)
    with InferenceClient([vllm_server.url], "smollm2-135m-instruct") as client:
        verdicts = client.chat(
            [{"role": "user", "content": "Is 7 prime? Reply in JSON."}], sampling
        )
    assert len(verdicts) == 4
    for verdict in verdicts:
        assert json.loads(verdict.text)["verdict"] in {"accept", "reject"}
        assert len(verdict.logprobs) == len(verdict.token_ids)


def test_seeded_requests_with_long_prompts_side_by_side_leave_the_engine_alive(
    vllm_server: VllmServer,
) -> None:
    # Reviews and calibration send seeded requests of environment files (about 1,500 tokens).
    # Several at once overflow one engine step's token budget; prefilled in parts, a seeded
    # request's discarded sample made vLLM rewind a CPU random generator and the engine died
    # ("CPU Generator does not use offset"): every later request answered 500.
    # (each prompt its own from the first token: shared prefixes would come from the cache)
    text = "alpha beta gamma delta " * 350
    with InferenceClient([vllm_server.url], "smollm2-135m-instruct", attempts=1) as client:

        def one(seed: int) -> int:
            sampling = Sampling(max_tokens=4, temperature=1.0, seed=seed)
            messages = [{"role": "user", "content": f"Text {seed}. Count its words: {text}"}]
            (answer,) = client.chat(messages, sampling)
            return len(answer.prompt_token_ids)

        with ThreadPoolExecutor(8) as pool:
            lengths = list(pool.map(one, range(8)))
        (after,) = client.chat(QUESTION, GREEDY)
    assert min(lengths) > 1400 and "Paris" in after.text
