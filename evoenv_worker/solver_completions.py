"""Completions from vLLM: the `complete` job as a plain function (generation queue).

Every completion keeps its token ids, the log-probs it was sampled with and its policy
version, so the trainer never re-tokenises text.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.config import Settings
from shared.inference import Completion, InferenceClient, Sampling
from shared.messages import CompletionRecord, SolverJob


def record(completion: Completion) -> CompletionRecord:
    return CompletionRecord(
        text=completion.text,
        prompt_token_ids=completion.prompt_token_ids,
        token_ids=completion.token_ids,
        logprobs=completion.logprobs,
        finish_reason=completion.finish_reason,
        policy_version=completion.policy_version,
    )


def complete_solver(client: InferenceClient, job: SolverJob) -> SolverJob:
    """The job with `group_size` completions of its prompt (unchanged if sampling failed)."""
    if job.error or job.over_budget or job.prompt is None:
        return job
    sampling = Sampling(n=job.group_size, temperature=job.temperature, max_tokens=job.max_tokens)
    completions = client.chat([{"role": "user", "content": job.prompt}], sampling)
    return job.model_copy(update={"completions": [record(c) for c in completions]})


def make_client(
    settings: Settings,
    version_source: Callable[[], int] | None = None,
    serving_clock: Callable[[], float] | None = None,
) -> InferenceClient:
    """The policy's client from settings (served model name: `settings.model`; in LoRA mode,
    `grpo.lora_rank` > 0, the newest version's adapter). With `serving_clock`, a request may
    take `worker.complete_time_limit` seconds on that clock (paused seconds left out) and
    `worker.complete_wall_limit` seconds in all; one that finds no server listening waits up to
    `worker.server_outage_wait` seconds for one to come back."""
    return InferenceClient(
        settings.vllm_urls,
        settings.model,
        version_source=version_source,
        connect_timeout=settings.worker.connect_timeout,
        request_timeout=settings.worker.complete_time_limit,
        serving_clock=serving_clock,
        wall_timeout=settings.worker.complete_wall_limit,
        adapters=settings.grpo.lora_rank > 0,
        api_key=settings.serve.api_key.get_secret_value(),
        outage_wait=min(
            settings.worker.server_outage_wait,
            settings.worker.complete_wall_limit - settings.worker.complete_time_limit,
        ),
    )
