"""Live weight push into the real server: a fine-tune changes what it generates, and back.

The model is fine-tuned in the test (a few AdamW steps on one distinctive sentence), pushed with
the `ReloadPublisher`, and the server's greedy answer becomes that sentence; pushing the
original weights brings the original answer back exactly. The policy version goes up at each
push and every completion reports it (from the server's per-token weight versions).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evoenv_learner.publisher import PushFailed, ReloadPublisher
from evoenv_model.serve import VllmServer
from shared import policy
from shared.inference import InferenceClient, Sampling

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Tell me something about the sea."}]
TARGET = "The purple lighthouse keeper counts 4711 silver whales every Tuesday."
GREEDY = Sampling(max_tokens=40, temperature=0.0)


def fine_tune(folder: Path, prompt_ids: list[int], target_ids: list[int]) -> torch.nn.Module:
    """A few AdamW steps on the prompt's answer `target_ids`, until the loss is tiny."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    ids = torch.tensor([prompt_ids + target_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100  # learn the answer only
    for _ in range(12):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.02:
            break
    return model.eval()


def test_push_changes_what_the_server_generates_and_back(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    store = redis.Redis.from_url(redis_url)
    client = InferenceClient(
        [vllm_server.url],
        "smollm2-135m-instruct",
        version_source=lambda: policy.read_version(store),
    )
    publisher = ReloadPublisher([vllm_server.url], store, tmp_path / "push", small_model)
    try:
        (original,) = client.chat(PROMPT, GREEDY)
        assert original.text != TARGET

        tokenizer = AutoTokenizer.from_pretrained(small_model)
        target_ids = tokenizer(TARGET, add_special_tokens=False).input_ids
        target_ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        tuned = fine_tune(small_model, original.prompt_token_ids, target_ids)

        first = publisher.publish(tuned)
        (changed,) = client.chat(PROMPT, GREEDY)
        assert changed.text == TARGET
        assert changed.token_ids == target_ids
        assert (changed.policy_version, changed.version_source) == (first, "server")

        base = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.bfloat16)
        second = publisher.publish(base)
        (restored,) = client.chat(PROMPT, GREEDY)
        assert restored.text == original.text
        assert restored.token_ids == original.token_ids
        assert second > first >= 1 and policy.read_version(store) == second
        assert (restored.policy_version, restored.version_source) == (second, "server")
    finally:
        publisher.close()
        client.close()
        store.close()


def test_a_broken_push_leaves_the_server_serving_the_previous_weights(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    """A truncated weights file fails to load (and breaks a CPU server's model mid-way): the
    publisher reloads the previous weights, resumes the server and keeps the version."""
    store = redis.Redis.from_url(redis_url)
    client = InferenceClient([vllm_server.url], "smollm2-135m-instruct")
    publisher = ReloadPublisher(
        [vllm_server.url], store, tmp_path / "push", small_model, attempts=1
    )
    try:
        (before,) = client.chat(PROMPT, GREEDY)
        broken = tmp_path / "broken"
        broken.mkdir()
        data = (small_model / "model.safetensors").read_bytes()
        (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
        with pytest.raises(PushFailed):
            publisher.push_folder(broken, 7)
        assert policy.read_version(store) == 0
        (after,) = client.chat(PROMPT, GREEDY)
        assert after.token_ids == before.token_ids
    finally:
        publisher.close()
        client.close()
        store.close()


def test_a_keep_mode_push_does_not_wait_for_the_requests_in_flight(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    """`serve.push_pause=keep`: long completions in flight during a push are frozen, go on under
    the new weights and finish; each counts as the version it started under (its oldest span),
    and a request sent after the push as the new one. The push returns while they still run.

    The pushed folder is the one the first push wrote, so the second push is the server's
    part alone (pause, reload, resume: about 1 s), not the write of the weights, which the
    claim is not about and which once took as long as four 384-token completions in a CI run.
    Four 256-token completions then outlast it many times over (a failure prints the
    timings)."""
    store = redis.Redis.from_url(redis_url)
    client = InferenceClient(
        [vllm_server.url],
        "smollm2-135m-instruct",
        version_source=lambda: policy.read_version(store),
    )
    publisher = ReloadPublisher(
        [vllm_server.url], store, tmp_path / "push", small_model, pause_mode="keep"
    )
    base = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.bfloat16)
    count = [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]
    long = Sampling(max_tokens=256, temperature=0.0)
    ends: list[float] = []
    try:
        first = publisher.publish(base)
        with ThreadPoolExecutor(4) as pool:
            began = time.monotonic()
            futures = [pool.submit(client.chat, count, long) for _ in range(4)]
            for f in futures:
                f.add_done_callback(lambda _f: ends.append(time.monotonic() - began))
            time.sleep(2.0)  # the requests are decoding
            pushed = time.monotonic() - began
            second = first + 1
            publisher.push_folder(publisher.current, second)
            returned = time.monotonic() - began
            running_after_push = sum(not f.done() for f in futures)
            completions = [f.result()[0] for f in futures]
        (after,) = client.chat(PROMPT, GREEDY)
        ended = sorted(round(end, 1) for end in ends)
        timing = f"push from {pushed:.1f} s to {returned:.1f} s; completions ended at {ended} s"
        assert running_after_push > 0, "the push waited for the completions in flight: " + timing
        assert all(c.finish_reason == "length" for c in completions), completions
        # The push came mid-way: a frozen completion went on under the new weights, its spans
        # name both versions, and it counts as the older. (A push that waited for the
        # completions leaves each with one span.)
        spans = [c.weight_versions for c in completions]
        assert [first, second] in spans, (first, second, spans, timing)
        assert all(c.policy_version == c.weight_versions[0] for c in completions), spans
        # Each counts as the version it started under: the first, unless the server had not
        # begun it before the pause (a busy machine); at least one was mid-way.
        versions = [(c.policy_version, c.version_source) for c in completions]
        assert set(versions) <= {(first, "server"), (second, "server")}, (first, second, versions)
        assert (first, "server") in versions, (first, second, versions)
        assert (after.policy_version, after.version_source) == (second, "server")
    finally:
        publisher.close()
        client.close()
        store.close()
