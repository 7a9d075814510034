"""What a live weight push costs beside restarting the server, and how fast the server generates.

    python bench/bench_model.py [--model smollm2-135m-instruct] [--pushes 3] [--max-tokens 128]

On one vLLM server started as `evoenv serve` starts it (CPU build here: eager mode), for the
chosen embedded model (default: the configured one):

- push latency: the model's weights, loaded with transformers as the learner holds them, made
  live with `ReloadPublisher.publish` (write the safetensors, pause, reload_weights, reset the
  prefix cache, label, bump the version in a private Redis, resume), `--pushes` times;
- the baseline: the same weights written to a servable folder, the server stopped and a new
  one started on that folder until /health answers;
- generation throughput (completion tokens per second, all requests together) with 1, 8 and
  32 requests in flight through `AsyncInferenceClient` (sampling at temperature 1).

Prints one table and the ratio restart / push.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402
import torch  # noqa: E402
from benchkit import private_redis  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from evoenv_learner.publisher import ReloadPublisher, write_weights  # noqa: E402
from evoenv_model.models import prepare_model  # noqa: E402
from evoenv_model.serve import VllmServer, start_server  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.inference import AsyncInferenceClient, Sampling  # noqa: E402
from shared.logging import configure_logging  # noqa: E402
from shared.ports import free_port  # noqa: E402

CONCURRENCY = (1, 8, 32)
PROMPT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


def start(settings: Settings, folder: Path, log_path: Path) -> tuple[VllmServer, float]:
    begin = time.monotonic()
    with log_path.open("ab") as log_file:
        server = start_server(settings, folder, output=log_file)
    return server, time.monotonic() - begin


async def throughput(url: str, model: str, in_flight: int, max_tokens: int) -> tuple[float, int]:
    """Completion tokens per second with `in_flight` requests at a time (2 rounds of them)."""
    requests = max(4, 2 * in_flight)
    sampling = Sampling(max_tokens=max_tokens, temperature=1.0, seed=None)
    gate = asyncio.Semaphore(in_flight)
    async with AsyncInferenceClient([url], model) as client:
        await client.chat(PROMPT, Sampling(max_tokens=4))  # warm up

        async def one() -> int:
            async with gate:
                (completion,) = await client.chat(PROMPT, sampling)
                return len(completion.token_ids)

        begin = time.monotonic()
        tokens = sum(await asyncio.gather(*(one() for _ in range(requests))))
        return tokens / (time.monotonic() - begin), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedded model (default: EVOENV_MODEL)")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "evoenv")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    args = parser.parse_args()

    base = Settings()
    configure_logging(base.log_format, base.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings(
        model=args.model or base.model,
        data_dir=args.data_dir,
        serve=base.serve.model_copy(
            update={"port": free_port(), "kv_cache_gib": args.kv_cache_gib, "max_model_len": 4096}
        ),
    )
    rows: list[tuple[str, str]] = []
    begin = time.monotonic()
    folder = prepare_model(settings)
    rows.append(("prepare (cached after the first run)", f"{time.monotonic() - begin:.1f} s"))

    work = Path(tempfile.mkdtemp(prefix="bench-model-"))
    redis_proc, redis_url = private_redis(work, append_only=False)
    log_path = work / "vllm.log"
    server, first_start = start(settings, folder, log_path)
    rows.append(("server start (to healthy)", f"{first_start:.1f} s"))
    try:
        weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        store = redis.Redis.from_url(redis_url)
        publisher = ReloadPublisher([server.url], store, work / "push", folder)
        pushes = []
        for _ in range(args.pushes):
            begin = time.monotonic()
            publisher.publish(weights)
            pushes.append(time.monotonic() - begin)
        publisher.close()
        push = statistics.median(pushes)
        rows.append((f"push, written to served (median of {args.pushes})", f"{push:.2f} s"))

        begin = time.monotonic()
        restart_dir = work / "restart"
        write_weights(weights, restart_dir, torch.bfloat16)
        for extra in folder.iterdir():
            if extra.suffix != ".safetensors" and not (restart_dir / extra.name).exists():
                shutil.copy(extra, restart_dir / extra.name)
        server.stop()
        server, _ = start(settings, restart_dir, log_path)
        restart = time.monotonic() - begin
        rows.append(("restart with new weights (write, stop, start)", f"{restart:.1f} s"))
        rows.append(("ratio restart / push", f"{restart / push:.0f}x"))

        for in_flight in CONCURRENCY:
            rate, tokens = asyncio.run(
                throughput(server.url, settings.model, in_flight, args.max_tokens)
            )
            rows.append((f"throughput, {in_flight} in flight", f"{rate:.1f} tok/s ({tokens} tok)"))
    finally:
        server.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    width = max(len(name) for name, _ in rows)
    print(f"\n{settings.model} on vLLM ({'GPU' if torch.cuda.is_available() else 'CPU'})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
