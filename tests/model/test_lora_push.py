"""LoRA mode against a real vLLM server (`--enable-lora`: the session's small-model server,
`model_support.lora_server_settings`): adapters pushed by the learner's `AdapterPublisher` under
versioned names, asked for by the workers' client.

The small model's adapter is fine-tuned in the test (a few AdamW steps on one distinctive
sentence, as `test_weight_push.py` does with full weights): pushed, the server's greedy answer
becomes that sentence, and asking for the previous version's adapter gives the original answer
back. A push does not pause anything: completions in flight finish on the adapter they asked
for. Adapters older than `max_staleness` versions are unloaded, and a request that asks for one
is retried on the newest. A learner resumed from a LoRA checkpoint pushes its adapter as the
next version.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import torch
from model_support import LORA, MAX_STALENESS, lora_server_settings

from evoenv_learner import loop
from evoenv_learner.publisher import AdapterPublisher
from evoenv_learner.trainer import Trainer
from evoenv_model.models import TEST_MODEL
from evoenv_model.serve import VllmServer
from shared import keys, policy
from shared.config import LearnerSettings
from shared.inference import InferenceClient, Sampling

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Tell me something about the sea."}]
TARGET = "The purple lighthouse keeper counts 4711 silver whales every Tuesday."
GREEDY = Sampling(max_tokens=40, temperature=0.0)


def loaded_adapters(server: VllmServer) -> set[str]:
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def unload_all(server: VllmServer) -> None:
    """Leave the session's server as it started: its adapters' folders go with the test."""
    for name in loaded_adapters(server):
        httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name})


def push_folders(tmp_path: Path) -> list[int]:
    return sorted(int(p.name[1:]) for p in (tmp_path / "push").iterdir())


def tune(trainer: Trainer, prompt_ids: list[int], target_ids: list[int]) -> None:
    """AdamW steps on the adapter alone until the prompt's answer is `target_ids`."""
    optimizer = torch.optim.AdamW(trainer.trainable, lr=3e-3)
    ids = torch.tensor([prompt_ids + target_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100  # learn the answer only
    for _ in range(60):
        loss = trainer.model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.02:
            return
    pytest.fail(f"the adapter did not learn the sentence (loss {loss.item():.3f})")


def test_an_adapter_push_changes_the_greedy_answer_and_the_previous_adapter_gives_it_back(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    store = redis.Redis.from_url(redis_url)
    newest = InferenceClient(
        [vllm_server.url],
        TEST_MODEL,
        version_source=lambda: policy.read_version(store),
        adapters=True,
    )
    publisher = AdapterPublisher(
        [vllm_server.url], store, tmp_path / "push", dtype=torch.float32, max_staleness=1
    )
    trainer = Trainer(small_model, LORA, device="cpu")
    assert trainer.tokenizer is not None
    try:
        (base,) = newest.chat(PROMPT, GREEDY)  # version 0: no adapter yet, the base model
        assert (base.policy_version, base.version_source) == (0, "adapter")
        first = publisher.publish(trainer.model)  # B = 0: the base model's answer
        (untrained,) = newest.chat(PROMPT, GREEDY)
        assert untrained.text == base.text
        assert (untrained.policy_version, untrained.version_source) == (first, "adapter")

        prompt_ids = trainer.tokenizer.apply_chat_template(
            PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        target_ids = trainer.tokenizer(TARGET + "<|im_end|>", add_special_tokens=False)
        tune(trainer, list(prompt_ids), target_ids["input_ids"])
        second = publisher.publish(trainer.model)
        (tuned,) = newest.chat(PROMPT, GREEDY)
        assert tuned.text.strip() == TARGET, tuned.text
        assert (tuned.policy_version, tuned.version_source) == (second, "adapter")

        # The previous version's adapter is still loaded and gives the original answer back.
        with InferenceClient(
            [vllm_server.url], TEST_MODEL, version_source=lambda: first, adapters=True
        ) as previous:
            (back,) = previous.chat(PROMPT, GREEDY)
        assert back.text == base.text
        assert back.policy_version == first

        # A third push retires the first (max_staleness 1): unloaded; a request still asking
        # for it is retried on the newest. Its folder stays two versions longer (a server
        # reads an adapter's files again when it brings it back into memory).
        third = publisher.publish(trainer.model)
        assert loaded_adapters(vllm_server) == {policy.adapter_name(v) for v in (second, third)}
        assert push_folders(tmp_path) == [first, second, third]
        fifth = [publisher.publish(trainer.model) for _ in range(2)][-1]
        assert loaded_adapters(vllm_server) == {policy.adapter_name(v) for v in (fifth - 1, fifth)}
        assert push_folders(tmp_path) == [second, third, fifth - 1, fifth]
        asked = itertools.chain([first], itertools.repeat(fifth))
        with InferenceClient(
            [vllm_server.url], TEST_MODEL, version_source=lambda: next(asked), adapters=True
        ) as stale:
            (retried,) = stale.chat(PROMPT, GREEDY)
        assert retried.policy_version == fifth
        assert retried.text.strip() == TARGET
    finally:
        unload_all(vllm_server)
        publisher.close()
        newest.close()
        store.close()


def test_an_adapter_push_does_not_wait_for_the_requests_in_flight(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    """Two completions asking for version N; the push of N + 1 returns while they run (no
    pause), and each finishes on N's adapter; a request after the push gets N + 1.

    How long the push takes is the bench's measure (`bench/bench_push.py`), not this test's: a
    CPU server loads an adapter between two engine steps, 0.03 s on an idle server and 0.8 to
    1.6 s here with these two decoding (2.7 s once in CI, 16 s on a loaded machine). The
    completions (96 tokens: 13 s on two cores of a Xeon with AMX, where 128 took 18 s and 64
    took 5 s) outlast such a push; a push that waited for them would return after both
    ended."""
    store = redis.Redis.from_url(redis_url)
    client = InferenceClient(
        [vllm_server.url],
        TEST_MODEL,
        version_source=lambda: policy.read_version(store),
        adapters=True,
    )
    publisher = AdapterPublisher(
        [vllm_server.url], store, tmp_path / "push", dtype=torch.float32, max_staleness=1
    )
    trainer = Trainer(small_model, LORA, device="cpu")
    count = [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]
    long = Sampling(max_tokens=96, temperature=0.0)
    ends: list[float] = []
    try:
        first = publisher.publish(trainer.model)
        with ThreadPoolExecutor(2) as pool:
            began = time.monotonic()
            futures = [pool.submit(client.chat, count, long) for _ in range(2)]
            for f in futures:
                f.add_done_callback(lambda _f: ends.append(time.monotonic() - began))
            time.sleep(1.0)  # the requests are decoding
            pushed = time.monotonic() - began
            second = publisher.publish(trainer.model)
            returned = time.monotonic() - began
            running_after_push = sum(not f.done() for f in futures)
            completions = [f.result()[0] for f in futures]
        (after,) = client.chat(PROMPT, GREEDY)
        ended = sorted(round(end, 1) for end in ends)
        timing = f"push from {pushed:.1f} s to {returned:.1f} s; completions ended at {ended} s"
        assert running_after_push == 2, "the push waited for the completions in flight: " + timing
        assert all(c.finish_reason == "length" for c in completions), completions
        assert {(c.policy_version, c.version_source) for c in completions} == {(first, "adapter")}
        assert (after.policy_version, after.version_source) == (second, "adapter")
    finally:
        unload_all(vllm_server)
        publisher.close()
        client.close()
        store.close()


def test_a_learner_resumed_from_a_lora_checkpoint_pushes_it_as_the_next_version(
    vllm_server: VllmServer, small_model: Path, redis_url: str, tmp_path: Path
) -> None:
    """The learner's resume (`loop.build(resume=True)`, as `evoenv learner --resume` builds it)
    in LoRA mode: the checkpoint holds an adapter tuned to answer TARGET, saved at version 3
    after step 1; Redis says 5 (pushes after that checkpoint). The resumed learner loads the
    adapter and pushes it as version 6 (never a number used before), which every request for
    the newest policy gets: TARGET."""
    run_dir = tmp_path / "run"
    trainer = Trainer(small_model, LORA, device="cpu")
    assert trainer.tokenizer is not None
    prompt_ids = trainer.tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    target_ids = trainer.tokenizer(TARGET + "<|im_end|>", add_special_tokens=False)
    tune(trainer, list(prompt_ids), target_ids["input_ids"])
    trainer.step_count = 1  # as if after one step: the checkpoint is step-00000001
    trainer.save_checkpoint(run_dir / "checkpoints", {"version": 3})
    store = redis.Redis.from_url(redis_url)
    store.set(keys.POLICY_VERSION, 5)
    settings = lora_server_settings().model_copy(
        update={
            "redis_url": redis_url,
            "vllm_urls": [vllm_server.url],
            "database_url": f"sqlite:///{tmp_path / 'archive.db'}",
            "learner": LearnerSettings(max_staleness=MAX_STALENESS, run_dir=run_dir, steps=1),
        }
    )
    newest = InferenceClient(
        [vllm_server.url],
        TEST_MODEL,
        version_source=lambda: policy.read_version(store),
        adapters=True,
    )

    async def resume() -> int:
        learner = await loop.build(
            settings, resume=True, on_step=None, republish=None, parallel=None, expire_groups=None
        )
        try:
            assert isinstance(learner.publisher, AdapterPublisher)
            assert learner.state.step == 1
            return learner.state.version
        finally:
            await learner.close()

    try:
        version = asyncio.run(resume())
        assert version == 6 and policy.read_version(store) == 6
        assert policy.adapter_name(6) in loaded_adapters(vllm_server)
        (answer,) = newest.chat(PROMPT, GREEDY)
        assert answer.text.strip() == TARGET, answer.text
        assert (answer.policy_version, answer.version_source) == (6, "adapter")
    finally:
        unload_all(vllm_server)
        newest.close()
        store.close()
