"""External evaluation: the served policy on reasoning-gym tasks, a yardstick nobody here wrote.

reasoning-gym (pinned in pyproject.toml) is trusted library code: its generators and scorers
run in this process, not in the sandbox, and need no network or data download. The protocol
is `evaluate_suite`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from evoenv_learner.held_out import summarise
from shared.config import Settings
from shared.environment import build_prompt, extract_answer
from shared.errors import ServiceUnavailable, UsageError
from shared.inference import AsyncInferenceClient, Sampling, bearer
from shared.policy import adapter_versions

log = structlog.get_logger(__name__)

SUITE = "reasoning-gym"

SEED = 42
"""The seed of every task's dataset: the same questions in every run."""

DEFAULT_TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "letter_counting",
    "spell_backward",
    "word_sorting",
)
"""One-step tasks with short answers (a number, a word, a short list) and short questions:
arithmetic, counting, string manipulation and sorting, within reach of a small model."""

IN_FLIGHT_PER_SERVER = 16
"""Completion requests in flight per model server."""

Complete = Callable[[str], Awaitable[str]]
"""A prompt to the policy's response text."""


@dataclass(frozen=True, slots=True)
class Item:
    """One question of a task, with the dataset that scores it."""

    task: str
    prompt: str
    entry: dict[str, Any]
    dataset: Any


@dataclass(frozen=True, slots=True)
class Scored:
    task: str
    score: float
    format_error: bool

    @property
    def passed(self) -> bool:
        return self.score == 1.0


def task_names() -> list[str]:
    """Every task reasoning-gym can generate."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_tasks(tasks: Sequence[str]) -> None:
    """`UsageError`, one line naming the valid tasks, if any of `tasks` is unknown."""
    valid = task_names()
    unknown = [task for task in tasks if task not in valid]
    if unknown:
        raise UsageError(
            f"unknown reasoning-gym task(s) {', '.join(unknown)}; choose from {', '.join(valid)}"
        )


def build_items(tasks: Sequence[str], n: int, seed: int = SEED) -> list[Item]:
    """`n` questions of each task (a task named twice counts once), in task order."""
    import reasoning_gym

    check_tasks(tasks)
    items = []
    for task in dict.fromkeys(tasks):
        dataset = reasoning_gym.create_dataset(task, size=n, seed=seed)
        for entry in dataset:
            items.append(Item(task, build_prompt(entry["question"]), entry, dataset))
    return items


def score_response(item: Item, response: str) -> Scored:
    """Extract the answer span and let the task's own scorer grade it."""
    answer = extract_answer(response).answer
    if answer is None:
        return Scored(item.task, 0.0, format_error=True)
    return Scored(item.task, float(item.dataset.score_answer(answer, item.entry)), False)


async def run_items(
    items: Sequence[Item],
    complete: Complete,
    concurrency: int,
    on_done: Callable[[Scored], None] | None = None,
) -> list[Scored]:
    """Complete and score every item, at most `concurrency` at a time; results in item order.
    The first failure cancels the rest and is raised as itself."""
    slots = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> Scored:
        async with slots:
            response = await complete(item.prompt)
        scored = score_response(item, response)
        if on_done is not None:
            on_done(scored)
        return scored

    try:
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(one(item)) for item in items]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in running]


def summarise_scores(scored: Sequence[Scored]) -> dict[str, Any]:
    """Pass rate per task and overall with the Wilson interval, mean score and format errors."""
    by_task: dict[str, list[Scored]] = {}
    for result in scored:
        by_task.setdefault(result.task, []).append(result)
    passes = {task: [float(r.passed) for r in results] for task, results in by_task.items()}
    out: dict[str, Any] = {"suite": SUITE, "seed": SEED, **summarise(passes)}
    out["mean_score"] = sum(r.score for r in scored) / len(scored) if scored else 0.0
    out["format_errors"] = sum(r.format_error for r in scored)
    for task, results in sorted(by_task.items()):
        out[f"instances_{task}"] = len(results)
        out[f"mean_score_{task}"] = sum(r.score for r in results) / len(results)
        out[f"format_errors_{task}"] = sum(r.format_error for r in results)
    return out


async def reachable(urls: Sequence[str], timeout: float) -> list[str]:
    """The servers among `urls` that answer /health with 200; `ServiceUnavailable` if none."""
    async with httpx.AsyncClient(timeout=timeout) as http:

        async def probe(url: str) -> str | None:
            try:
                response = await http.get(f"{url.rstrip('/')}/health")
            except httpx.TransportError as exc:
                return f"{url}: {type(exc).__name__}"
            return None if response.status_code == 200 else f"{url}: {response.status_code}"

        problems = await asyncio.gather(*(probe(url) for url in urls))
    healthy = [url for url, problem in zip(urls, problems, strict=True) if problem is None]
    if not healthy:
        raise ServiceUnavailable(
            f"no model server answers /health ({'; '.join(p for p in problems if p)}); "
            "start one with `evoenv serve` or set EVOENV_VLLM_URLS"
        )
    return healthy


async def newest_adapter(urls: Sequence[str], timeout: float, api_key: str = "") -> int:
    """LoRA mode: the newest policy version whose adapter (`policy-v{N}`) a server among `urls`
    lists at `GET /v1/models`; 0 (the base model) when none has one. The evaluation asks that
    adapter throughout; a server without it answers 404 and the request goes to another.
    `api_key`: the servers' bearer token (`serve.api_key`)."""
    async with httpx.AsyncClient(timeout=timeout, headers=bearer(api_key)) as http:

        async def held(url: str) -> list[int]:
            try:
                response = await http.get(f"{url.rstrip('/')}/v1/models")
                response.raise_for_status()
                names = [m.get("id", "") for m in response.json().get("data", [])]
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.warning("adapter_list_failed", server=url, error=str(exc) or type(exc).__name__)
                return []
            return adapter_versions(n for n in names if isinstance(n, str))

        lists = await asyncio.gather(*(held(url) for url in urls))
    return max((v for versions in lists for v in versions), default=0)


async def evaluate_suite(
    settings: Settings,
    tasks: Sequence[str] = DEFAULT_TASKS,
    n: int = 16,
    on_done: Callable[[Scored], None] | None = None,
) -> dict[str, Any]:
    """The served policy on `n` reasoning-gym questions of each task, summarised.

    For each task:

    - instances: `reasoning_gym.create_dataset(task, size=n, seed=SEED)`. The seed is fixed, so
      every run sees the same questions; the library seeds item i from `SEED + i`, so `-n 4`
      asks the first four questions of `-n 16`;
    - the prompt: the question, then our answer instruction (`build_prompt`), as one user
      message;
    - the completion: one per instance from the served policy (in LoRA mode the newest adapter
      the servers hold, `newest_adapter`), greedy (temperature 0), at most
      `grpo.max_tokens` tokens, many requests in flight across `vllm_urls`;
    - the grade: `extract_answer` (no `<answer>` span is a format error, score 0), then the
      dataset's own `score_answer(answer, entry)`; a pass is a score of exactly 1.0.

    Returns the pass rate per task and overall (95 % Wilson interval on the overall one, as the
    held-out evaluation), the mean score (reasoning-gym gives partial credit) and format
    errors. A server that cannot be reached raises `ServiceUnavailable`; an unknown task
    `UsageError`.
    """
    items = build_items(tasks, n)
    urls = await reachable(settings.vllm_urls, settings.worker.connect_timeout)
    sampling = Sampling(max_tokens=settings.grpo.max_tokens, temperature=0.0)
    lora = settings.grpo.lora_rank > 0
    api_key = settings.serve.api_key.get_secret_value()
    timeout = settings.worker.connect_timeout
    version = await newest_adapter(urls, timeout, api_key) if lora else None

    async def served() -> int:
        return version or 0

    log.info(
        "external_eval_started", suite=SUITE, tasks=list(dict.fromkeys(tasks)), instances=n,
        seed=SEED, model=settings.model, adapter_version=version, servers=urls,
        max_tokens=sampling.max_tokens,
    )  # fmt: skip
    async with AsyncInferenceClient(
        urls,
        settings.model,
        version_source=served if lora else None,
        connect_timeout=settings.worker.connect_timeout,
        request_timeout=settings.worker.complete_time_limit,
        adapters=lora,
        api_key=api_key,
    ) as client:

        async def complete(prompt: str) -> str:
            (completion,) = await client.chat([{"role": "user", "content": prompt}], sampling)
            return completion.text

        scored = await run_items(items, complete, IN_FLIGHT_PER_SERVER * len(urls), on_done)
    summary = summarise_scores(scored)
    log.info("external_eval_done", suite=SUITE, pass_rate=summary["pass_rate"])
    return summary
