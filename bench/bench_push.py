"""How long a weight push pauses the servers while completions are in flight, by pause mode.

    python bench/bench_push.py [--model M] [--pushes 10] [--in-flight 4] [--max-tokens 96]

One vLLM server started as `evoenv serve` starts it, with `--in-flight` completions kept
running all the time (each one that ends is replaced). Every few seconds the same weights are
made live again as a new version with `ReloadPublisher.push_folder` (pause, reload_weights,
reset the prefix cache, label, bump the version, resume): the write is done once beforehand
and not counted, so each figure is the pause itself. Three modes, `--pushes` each:

- `wait` (the baseline): in-flight completions run to their end under the old weights first;
- `keep`: they are frozen, the weights swapped, every cached block dropped (theirs too, so they
  are recomputed under the new weights) and they go on: the default (`EVOENV_SERVE__PUSH_PAUSE`);
- `keep, no reset`: the same without resetting the prefix cache (the frozen requests go on with
  KV computed under the old weights, and new requests may reuse stale cached blocks).

Prints a table (median, p95, max seconds; completions that ended during each mode, how many of
them were aborted instead of finishing, and their tokens per second of the mode's run). Then,
unless `--no-lora`, LoRA beside full fine-tuning (`bench_lora.py`: step time and memory,
adapter pushes with completions in flight, generation with an adapter, checkpoint size), and
last `push-summary: full_wait_p95=X full_keep_pause_p95=X` with, after LoRA,
`lora_push_p95=X lora_step_ratio=X lora_gen_ratio=X lora_ckpt_mb=X`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import threading
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
from evoenv_model.serve import start_server  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.hardware import cpu_flags, serving_dtype  # noqa: E402
from shared.inference import AsyncInferenceClient, Completion, Sampling  # noqa: E402
from shared.logging import configure_logging  # noqa: E402
from shared.ports import free_port  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
MODES = (("wait", "wait", True), ("keep", "keep", True), ("keep, no reset", "keep", False))


class Load:
    """`in_flight` completions kept running on a thread of their own until `stop`."""

    def __init__(self, url: str, model: str, in_flight: int, max_tokens: int) -> None:
        self.url, self.model, self.in_flight = url, model, in_flight
        self.sampling = Sampling(max_tokens=max_tokens, temperature=1.0, seed=None)
        self.done: list[Completion] = []
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        async with AsyncInferenceClient([self.url], self.model) as client:

            async def keep_one() -> None:
                while self.running.is_set():
                    self.done.extend(await client.chat(PROMPT, self.sampling))

            await asyncio.gather(*(keep_one() for _ in range(self.in_flight)))

    def take(self) -> list[Completion]:
        taken, self.done = self.done, []
        return taken

    def stop(self) -> None:
        self.running.clear()
        self.thread.join(600)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="embedded model (default: EVOENV_MODEL)")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "evoenv")
    parser.add_argument("--pushes", type=int, default=10, help="pushes per mode")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between pushes")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--no-lora", action="store_true", help="full-weight pushes only")
    args = parser.parse_args()

    base = Settings()
    configure_logging(base.log_format, "WARNING")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings(
        model=args.model or base.model,
        data_dir=args.data_dir,
        serve=base.serve.model_copy(
            update={"port": free_port(), "kv_cache_gib": 2, "max_model_len": 4096}
        ),
    )
    gpu = torch.cuda.is_available()
    dtype = getattr(torch, serving_dtype(settings.serve.dtype, gpu=gpu, flags=cpu_flags()))
    folder = prepare_model(settings)
    work = Path(tempfile.mkdtemp(prefix="bench-push-"))
    redis_proc, redis_url = private_redis(work, append_only=False)
    with (work / "vllm.log").open("ab") as log_file:
        server = start_server(settings, folder, output=log_file)
    rows: list[tuple[str, list[float], int, int, float]] = []
    try:
        weights = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        pushed = write_weights(weights, work / "pushed", dtype)
        del weights
        publisher = ReloadPublisher([server.url], redis.Redis.from_url(redis_url), work, folder)
        load = Load(server.url, settings.model, args.in_flight, args.max_tokens)
        for name, pause_mode, reset in MODES:
            publisher.pause_mode = pause_mode
            for control in publisher.servers:
                control.__dict__.pop("reset_prefix_cache", None)
                if not reset:
                    control.reset_prefix_cache = lambda running=False: None  # type: ignore[method-assign]
            seconds = []
            load.take()
            window = time.monotonic()
            for _ in range(args.pushes):
                time.sleep(args.gap)
                version = publisher.next_version(None)
                begin = time.monotonic()
                publisher.push_folder(pushed, version)
                seconds.append(time.monotonic() - begin)
                print(f"  {name:<15} push {len(seconds):>2}: {seconds[-1]:6.2f} s", flush=True)
            time.sleep(args.gap)
            ended = load.take()
            aborted = sum(1 for c in ended if c.finish_reason == "abort")
            rate = sum(len(c.token_ids) for c in ended) / (time.monotonic() - window)
            rows.append((name, seconds, len(ended), aborted, rate))
        load.stop()
        publisher.close()
    finally:
        server.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{settings.model} on vLLM ({'GPU' if gpu else 'CPU'}, {dtype}),"
        f" {args.in_flight} completions of up to {args.max_tokens} tokens in flight"
    )
    print(
        f"  {'mode':<15} {'median s':>9} {'p95 s':>7} {'max s':>7} {'ended':>6} {'aborted':>8}"
        f" {'tokens/s':>9}"
    )
    for name, seconds, ended, aborted, rate in rows:
        print(
            f"  {name:<15} {statistics.median(seconds):9.2f} {p95(seconds):7.2f}"
            f" {max(seconds):7.2f} {ended:6d} {aborted:8d} {rate:9.1f}"
        )
    wait_p95, keep_p95 = p95(rows[0][1]), p95(rows[1][1])
    print(f"  ratio keep / wait (p95): {keep_p95 / wait_p95:.2f}")
    line = f"push-summary: full_wait_p95={wait_p95:.2f} full_keep_pause_p95={keep_p95:.2f}"
    if not args.no_lora:
        from bench_lora import run, summary

        line += " " + summary(run(settings.model, args.lora_rank, args.pushes, args.in_flight, 2))
    print(line)


if __name__ == "__main__":
    main()
