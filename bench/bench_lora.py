"""LoRA beside full fine-tuning: the trainer's step and memory, the adapter push, generation
with an adapter, the checkpoint. `bench_push.py` runs it after the full-weight pushes and
prints its figures on its last line; alone:

    python bench/bench_lora.py [--model M] [--rank 8] [--pushes 10] [--in-flight 4]

- step: one optimiser step on the same graded groups at the sizes `evoenv up` uses on a CPU
  (one group of 4, micro-batches of 1, 200 prompt and 384 completion tokens), full and LoRA,
  each in a process of its own (peak memory is the process's high-water mark), after a
  warm-up step; the median of `--rounds`;
- push: `AdapterPublisher.publish` with `--in-flight` completions asking for the newest adapter
  running all the time (write and load; nothing is paused);
- generation: tokens per second at 1, 8 and 16 in flight on the LoRA-enabled server, asking
  for the base model and for an adapter (the same server, one after the other);
- checkpoint: the size of a LoRA checkpoint folder beside a full one's (the full one computed
  by `Trainer.checkpoint_bytes`, not written: 6 GB).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402
import torch  # noqa: E402

from evoenv_learner.publisher import AdapterPublisher  # noqa: E402
from evoenv_learner.trainer import Trainer  # noqa: E402
from evoenv_model.models import prepare_model  # noqa: E402
from evoenv_model.serve import start_server  # noqa: E402
from shared import policy  # noqa: E402
from shared.config import GrpoSettings, LearnerSettings, Settings  # noqa: E402
from shared.hardware import cpu_flags, serving_dtype  # noqa: E402
from shared.inference import AsyncInferenceClient, Sampling  # noqa: E402
from shared.ports import free_port  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
MAX_STALENESS = 4


def grpo(rank: int) -> GrpoSettings:
    """The CPU sizes of `evoenv up` (evoenv_cli/up.py), full (rank 0) or LoRA."""
    return GrpoSettings(micro_batch=1, group_size=4, batch_groups=1, lora_rank=rank)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


# ------------------------------------------------------------------------------------ step


def step_in_this_process(model: str, rank: int, rounds: int) -> dict[str, float]:
    """One way's step figures (run as `bench_lora.py step`, a process of its own)."""
    from bench_dtype import make_groups

    folder = prepare_model(Settings(model=model))
    trainer = Trainer(folder, grpo(rank), device="cpu")
    groups = make_groups(trainer, 1, 4, 200, 384)
    trainer.step(groups)  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        trainer.step(groups)
        times.append(time.perf_counter() - start)
    out = {
        "seconds": statistics.median(times),
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "checkpoint_bytes": trainer.checkpoint_bytes(),
    }
    if rank:
        with tempfile.TemporaryDirectory() as tmp:
            saved = trainer.save_checkpoint(tmp)
            out["checkpoint_bytes"] = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
    return out


def step_figures(model: str, rank: int, rounds: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "step", "--model", model, "--rank", str(rank),
         "--rounds", str(rounds)],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------- server measurements


class Load:
    """`in_flight` completions asking for the newest adapter, kept running until `stop`."""

    def __init__(self, url: str, model: str, version: Any, in_flight: int) -> None:
        self.args = (url, model, version, in_flight)
        self.tokens = 0
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        url, model, version, in_flight = self.args

        async def newest() -> int:
            return int(version())

        sampling = Sampling(max_tokens=96, temperature=1.0)
        async with AsyncInferenceClient(
            [url], model, version_source=newest, adapters=True
        ) as client:

            async def keep_one() -> None:
                while self.running.is_set():
                    (done,) = await client.chat(PROMPT, sampling)
                    self.tokens += len(done.token_ids)

            await asyncio.gather(*(keep_one() for _ in range(in_flight)))

    def stop(self) -> None:
        self.running.clear()
        self.thread.join(600)


async def tokens_per_second(url: str, model: str, in_flight: int, version: int) -> float:
    """Tokens a second with `in_flight` 96-token completions at once (two rounds)."""

    async def at() -> int:
        return version

    sampling = Sampling(max_tokens=96, temperature=1.0)
    async with AsyncInferenceClient([url], model, version_source=at, adapters=True) as client:
        await client.chat(PROMPT, Sampling(max_tokens=8))  # warm
        start = time.monotonic()
        results = await asyncio.gather(
            *(client.chat(PROMPT, sampling) for _ in range(2 * in_flight))
        )
        tokens = sum(len(c.token_ids) for (c,) in results)
    return tokens / (time.monotonic() - start)


def serving_figures(model: str, rank: int, pushes: int, in_flight: int, work: Path,
                    redis_url: str) -> dict[str, Any]:  # fmt: skip
    """Push and generation figures on one LoRA-enabled server of `model`."""
    settings = Settings(
        model=model,
        data_dir=REPO / ".cache" / "evoenv",
        grpo=grpo(rank),
        learner=LearnerSettings(max_staleness=MAX_STALENESS),
    )
    settings = settings.model_copy(
        update={"serve": settings.serve.model_copy(update={"port": free_port(), "kv_cache_gib": 2,
                                                           "max_model_len": 4096})}
    )  # fmt: skip
    gpu = torch.cuda.is_available()
    dtype = getattr(torch, serving_dtype(settings.serve.dtype, gpu=gpu, flags=cpu_flags()))
    folder = prepare_model(settings)
    trainer = Trainer(folder, settings.grpo, device="cpu")
    with torch.no_grad():  # an adapter that changes something (B is zero at the start)
        for name, tensor in trainer.model.named_parameters():
            if "lora_B" in name:
                tensor.normal_(0, 1e-3)
    store = redis.Redis.from_url(redis_url)
    with (work / "vllm-lora.log").open("ab") as log_file:
        server = start_server(settings, folder, output=log_file)
    try:
        publisher = AdapterPublisher(
            [server.url], store, work / "adapters", dtype=dtype, max_staleness=MAX_STALENESS
        )
        first = publisher.publish(trainer.model)
        generation = {}
        for n in (1, 8, 16):
            base = asyncio.run(tokens_per_second(server.url, model, n, 0))
            adapter = asyncio.run(tokens_per_second(server.url, model, n, first))
            generation[n] = (base, adapter)
            print(f"  generation, {n:>2} in flight: base {base:6.1f} tokens/s, "
                  f"adapter {adapter:6.1f} ({adapter / base:.2f}x)", flush=True)  # fmt: skip
        load = Load(server.url, model, lambda: policy.read_version(store), in_flight)
        seconds = []
        for _ in range(pushes):
            time.sleep(2.0)
            begin = time.monotonic()
            publisher.publish(trainer.model)
            seconds.append(time.monotonic() - begin)
            print(f"  lora push {len(seconds):>2}: {seconds[-1]:6.3f} s", flush=True)
        load.stop()
        publisher.close()
        return {"push": seconds, "generation": generation, "dtype": str(dtype)}
    finally:
        server.stop()
        store.close()
        del trainer
        gc.collect()


def lora_figures(model: str, rank: int, pushes: int, in_flight: int, rounds: int, work: Path,
                 redis_url: str) -> dict[str, Any]:  # fmt: skip
    """Everything, with the table printed; returns the summary figures."""
    serving = serving_figures(model, rank, pushes, in_flight, work, redis_url)
    full = step_figures(model, 0, rounds)
    lora = step_figures(model, rank, rounds)
    push = serving["push"]
    print(f"\nLoRA (rank {rank}) beside full fine-tuning, {model}, served in {serving['dtype']}")
    print(f"  {'':<28} {'full':>10} {'LoRA':>10} {'LoRA/full':>10}")
    print(f"  {'step, s (median)':<28} {full['seconds']:10.1f} {lora['seconds']:10.1f}"
          f" {lora['seconds'] / full['seconds']:10.2f}")  # fmt: skip
    print(f"  {'peak memory, GiB':<28} {full['peak_gib']:10.1f} {lora['peak_gib']:10.1f}"
          f" {lora['peak_gib'] / full['peak_gib']:10.2f}")  # fmt: skip
    print(f"  {'checkpoint, MB':<28} {full['checkpoint_bytes'] / 1e6:10.0f}"
          f" {lora['checkpoint_bytes'] / 1e6:10.1f}"
          f" {lora['checkpoint_bytes'] / full['checkpoint_bytes']:10.4f}")  # fmt: skip
    print(f"  LoRA push with {in_flight} in flight: p50 {statistics.median(push):.3f} s, "
          f"p95 {p95(push):.3f} s, max {max(push):.3f} s ({len(push)} pushes)")  # fmt: skip
    gen = serving["generation"]
    for n, (base, adapter) in gen.items():
        print(f"  generation at {n:>2} in flight: {adapter / base:.2f}x the base model's tokens/s")
    return {
        "lora_push_p95": p95(push),
        "lora_step_ratio": lora["seconds"] / full["seconds"],
        "lora_gen_ratio": gen[8][1] / gen[8][0],
        "lora_ckpt_mb": lora["checkpoint_bytes"] / 1e6,
    }


def summary(figures: dict[str, Any]) -> str:
    return (
        f"lora_push_p95={figures['lora_push_p95']:.3f} "
        f"lora_step_ratio={figures['lora_step_ratio']:.2f} "
        f"lora_gen_ratio={figures['lora_gen_ratio']:.2f} "
        f"lora_ckpt_mb={figures['lora_ckpt_mb']:.1f}"
    )


def run(model: str, rank: int, pushes: int, in_flight: int, rounds: int) -> dict[str, Any]:
    """Every figure, with a private Redis; the table printed."""
    from benchkit import private_redis

    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    redis_proc, redis_url = private_redis(work, append_only=False)
    try:
        return lora_figures(model, rank, pushes, in_flight, rounds, work, redis_url)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=["all", "step"])
    parser.add_argument("--model", default=Settings().model)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.what == "step":
        print(json.dumps(step_in_this_process(args.model, args.rank, args.rounds)))
        return
    print(summary(run(args.model, args.rank, args.pushes, args.in_flight, args.rounds)))


if __name__ == "__main__":
    main()
