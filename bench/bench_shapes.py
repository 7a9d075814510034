"""The learner's resident size over steps whose sequences all differ in length, with each
micro-batch padded to a multiple of 64 tokens (`grpo.pad_to_multiple`, the default) and
unpadded (1, the baseline), in the same run.

    python bench/bench_shapes.py [--steps 16] [--multiples 1,64] [--seed 0]

Each way runs in a process of its own, which builds the real `Trainer` on the embedded model
with `evoenv up`'s CPU sizes (groups of 4, one a step, micro-batches of 1) and trains it on
solver groups of made-up tokens (`bench_memory.make_group`) whose prompt and completion lengths
are drawn anew for every step (60-199 and 20-79 tokens: short, so a step takes seconds; the
same draws for every way). After each step it releases memory as the learner does
(`memory.release_memory`) and reads the resident size. A CPU's matrix libraries keep kernels
and buffers for each shape they have seen, so without padding every new length adds to it.
The table gives, per way, the resident size after the first and the last step, the growth per
step over the second half (the first steps meet new shapes in every way), and the mean seconds
a step; the last line `growth_mib_per_step=X seconds_ratio=X` is the last way's growth and its
step time over the first way's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_memory import _cpu_name, make_group, meter

REPO = Path(__file__).resolve().parents[1]


def run_way(multiple: int, steps: int, seed: int) -> dict[str, Any]:
    memory = meter()
    memory.keep_heap_small()
    sys.path.insert(0, str(REPO))
    from evoenv_learner.trainer import Trainer
    from evoenv_model.models import prepare_model
    from shared.config import GrpoSettings, Settings

    settings = GrpoSettings(group_size=4, batch_groups=1, micro_batch=1, pad_to_multiple=multiple)
    trainer = Trainer(prepare_model(Settings()), settings, device="cpu")
    vocab = trainer.model.config.vocab_size
    rng = random.Random(seed)
    after, seconds = [], []
    for index in range(steps):
        prompt, completion = rng.randrange(60, 200), rng.randrange(20, 80)
        group = make_group(vocab, "solver", prompt, completion, index)
        start = time.perf_counter()
        trainer.step([group])
        seconds.append(time.perf_counter() - start)
        memory.release_memory()
        after.append(memory.rss_gib())
        print(json.dumps({"multiple": multiple, "step": index, "length": prompt + completion,
                          "seconds": round(seconds[-1], 1), "after_gib": round(after[-1], 3)}),
              file=sys.stderr, flush=True)  # fmt: skip
    half = steps // 2
    growth = (after[-1] - after[half - 1]) / (steps - half) * 1024
    return {"multiple": multiple, "first": after[0], "last": after[-1], "growth": growth,
            "seconds": sum(seconds) / len(seconds)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--multiples", default="1,64", help="the first is the baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--way", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 4:
        raise SystemExit("--steps must be at least 4")
    if args.way is not None:
        print(json.dumps(run_way(args.way, args.steps, args.seed)))
        return
    results = []
    for multiple in (int(m) for m in args.multiples.split(",")):
        done = subprocess.run(
            [sys.executable, __file__, "--way", str(multiple), "--steps", str(args.steps),
             "--seed", str(args.seed)],
            stdout=subprocess.PIPE, text=True, check=True,
        )  # fmt: skip
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(f"{_cpu_name()}, {os.cpu_count()} cores; {args.steps} solver steps of new lengths")
    print("| pad to | after step 1, GiB | after the last, GiB | growth, MiB a step | s a step | "
          "s / baseline |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['multiple']} | {r['first']:.3f} | {r['last']:.3f} | {r['growth']:.1f} | "
              f"{r['seconds']:.1f} | {r['seconds'] / base['seconds']:.2f} |")  # fmt: skip
    last = results[-1]
    print(f"growth_mib_per_step={last['growth']:.1f} "
          f"seconds_ratio={last['seconds'] / base['seconds']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
