"""The learner's peak memory by phase at `evoenv up`'s CPU sizes, beside the floor of full
fine-tuning (float32 weights, gradients and AdamW's two moments: 16 bytes a weight), for the
learner as it is and as it was at a baseline commit, in the same run.

    python bench/bench_memory.py [--model M] [--steps wg] [--ways baseline,fixed]
                                 [--baseline 084aed8]

Each way runs in a process of its own, which builds the real `Trainer` on the model folder
(`evoenv model prepare`) with `evoenv up`'s CPU sizes (groups of 4, one a step, micro-batches
of 1, gradient checkpointing and chunked log-probs on, bfloat16 autocast where the CPU computes
it natively) and feeds it graded groups of made-up token ids, one a step, in the order
`--steps` gives: `s` a solver group (4 x 300 prompt + 384 completion tokens), `g` a generator
group (4 x 1,500 + 1,024), `w` a small solver group (4 x 32 + 32: it makes AdamW's state, so
that the next step runs with it, as every step of a run but the first does). Steps run on two
threads in turn, as `asyncio.to_thread` spreads the learner's calls over its pool. Then the
weights a full-weight push writes (`publisher.write_weights`, in the autocast dtype) and a
checkpoint (`Trainer.save_checkpoint`). Each phase's peak is the process's high-water mark
from a reset at its start (`memory.reset_peak`, `memory.peak_rss_gib`):

- forward, backward: the worst micro-batch's forward pass (the log-probs), and its backward
  pass (the gradients accumulating into those of the micro-batches before);
- optimiser: gradient clipping and AdamW's step;
- push: the weights written for a push; checkpoint: the checkpoint written;

and `after` is the resident size after the step and `release_memory`. `sys s` is the system
CPU time of the worst step (page faults and mappings: what giving memory back costs). Ways:

- `baseline`: the learner's code at `--baseline` (default: the commit before the memory fixes),
  glibc's allocator as it comes;
- `code`: the learner's code as it is, glibc's allocator as it comes;
- `fixed`: the learner's code as it is, glibc's allocator set as the learner sets it at start
  (`memory.keep_heap_small`).

It prints one table, a row per phase, each way's peak in GiB (the worst over the steps of that
kind) and its ratio to the first way's, and a last line `memory_peak_gib=X memory_ratio=X` (the
last way's peak over all phases, and its ratio to the first way's). A way takes 5-8 minutes on
two cores with the default steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASELINE = "084aed8"
"""The commit before the memory fixes (docs/results.md#learner-memory)."""
SIZES = {"s": ("solver", 300, 384), "g": ("generator", 1500, 1024), "w": ("solver", 32, 32)}
GROUP = 4
PACKAGES = ("evoenv_learner", "evoenv_model", "shared")


def meter() -> ModuleType:
    """This tree's `evoenv_learner/memory.py` (it imports nothing of the project), loaded under
    a name of its own: the baseline's may not have the peak functions."""
    spec = importlib.util.spec_from_file_location(
        "bench_memory_meter", REPO / "evoenv_learner" / "memory.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_group(vocab: int, role: str, prompt_len: int, completion_len: int, seed: int) -> Any:
    """A graded group of made-up token ids (rewards 0, 1, 0, 1: none is skipped)."""
    from shared.messages import GeneratorGroupData, GradedCompletion, GradedGroup, SolverGroupData

    rng = random.Random(seed)
    prompt = [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]
    completions = [
        GradedCompletion(
            text="x",
            prompt_token_ids=prompt,
            token_ids=[rng.randrange(100, vocab - 100) for _ in range(completion_len)],
            logprobs=[-2.0] * completion_len,
            finish_reason="length",
            reward=float(i % 2),
            outcome="scored",
        )
        for i in range(GROUP)
    ]
    data = (
        GeneratorGroupData(funnel=["L1"] * GROUP, gamma=1.0)
        if role == "generator"
        else SolverGroupData()
    )
    return GradedGroup(
        run="bench",
        group_id=f"g{seed}",
        role=role,  # type: ignore[arg-type]
        env_name="e",
        env_sha="0" * 64,
        seed=seed,
        difficulty=1,
        prompt="p",
        policy_version=0,
        completions=completions,
        data=data,
    )


def run_way(way: str, code: Path, model: str, steps: str) -> dict[str, Any]:
    """One way's figures, in this process, with the project's code from `code`."""
    memory = meter()
    if way == "fixed" and not memory.keep_heap_small():
        raise SystemExit("no glibc mallopt here: the fixed way is the code way")
    if not memory.reset_peak():
        raise SystemExit("this system cannot reset the peak resident size (/proc/self/clear_refs)")
    sys.path.insert(0, str(code))
    import torch

    from evoenv_learner.publisher import write_weights
    from evoenv_learner.trainer import Trainer
    from evoenv_model.models import prepare_model
    from shared.config import GrpoSettings, Settings

    folder = prepare_model(Settings(model=model))
    settings = GrpoSettings(group_size=GROUP, batch_groups=1, micro_batch=1)
    trainer = Trainer(folder, settings, device="cpu")
    params = sum(p.numel() for p in trainer.model.parameters())
    figures: dict[str, Any] = {
        "way": way,
        "floor": 16 * params / 2**30,
        "loaded": memory.rss_gib(),
        "autocast": str(trainer.autocast_dtype),
        "attention": trainer.model.config._attn_implementation,
        "steps": [],
    }
    phase: dict[str, float] = {}
    logprobs, optimizer_step = trainer._logprobs, trainer._optimizer_step

    def mark(name: str) -> None:
        phase[name] = max(phase.get(name, 0.0), memory.peak_rss_gib())
        memory.reset_peak()

    def forward(*args: Any, **kwargs: Any) -> Any:
        mark("backward")  # the micro-batch before's (before the first: the step's set-up)
        try:
            return logprobs(*args, **kwargs)
        finally:
            mark("forward")

    def step(metrics: Any) -> None:
        mark("backward")
        optimizer_step(metrics)
        mark("optimiser")

    trainer._logprobs = forward  # type: ignore[method-assign]
    trainer._optimizer_step = step  # type: ignore[method-assign]
    vocab = trainer.model.config.vocab_size
    threads = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    for index, kind in enumerate(steps):
        role, prompt_len, completion_len = SIZES[kind]
        group = make_group(vocab, role, prompt_len, completion_len, index)
        phase.clear()
        memory.reset_peak()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        metrics = threads[index % 2].submit(trainer.step, [group]).result()
        seconds = time.perf_counter() - start
        system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - usage.ru_stime
        held = memory.rss_gib()
        memory.release_memory()
        figures["steps"].append(
            {"kind": kind, "seconds": seconds, "sys": system, "stepped": metrics.stepped,
             "held": held, "after": memory.rss_gib(), **phase}
        )  # fmt: skip
        print(json.dumps(figures["steps"][-1]), file=sys.stderr, flush=True)
    dtype = trainer.autocast_dtype or torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        memory.reset_peak()
        threads[0].submit(write_weights, trainer.model, Path(tmp) / "push", dtype).result()
        figures["push"] = memory.peak_rss_gib()
        memory.release_memory()
        memory.reset_peak()
        threads[1].submit(trainer.save_checkpoint, Path(tmp) / "checkpoints").result()
        figures["checkpoint"] = memory.peak_rss_gib()
    return figures


def peak_of(figures: dict[str, Any]) -> float:
    keys = ("forward", "backward", "optimiser")
    steps = [max(s.get(key, 0.0) for key in keys) for s in figures["steps"]]
    return max([*steps, figures["push"], figures["checkpoint"]])


def table(results: list[dict[str, Any]]) -> str:
    base = results[0]
    header = ["phase"]
    for figures in results:
        header.append(f"{figures['way']}, GiB")
        if figures is not base:
            header.append(f"{figures['way']} / {base['way']}")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]

    def row(name: str, values: list[float], unit: str = "{:.2f}") -> None:
        cells = [name]
        for i, value in enumerate(values):
            cells.append(unit.format(value))
            if i:
                cells.append(f"{value / values[0]:.2f}" if values[0] else "-")
        lines.append("| " + " | ".join(cells) + " |")

    def worst(figures: dict[str, Any], kind: str, key: str) -> float:
        return max((s.get(key, 0.0) for s in figures["steps"] if s["kind"] == kind), default=0.0)

    row("floor: weights, gradients, AdamW (16 bytes a weight)", [r["floor"] for r in results])
    row("model loaded (weights and libraries)", [r["loaded"] for r in results])
    for kind, name in (("w", "small step"), ("s", "solver step"), ("g", "generator step")):
        if any(s["kind"] == kind for s in base["steps"]):
            for key in ("forward", "backward", "optimiser", "after"):
                row(f"{name}: {key}", [worst(r, kind, key) for r in results])
            row(f"{name}: sys s", [worst(r, kind, "sys") for r in results], "{:.1f}")
            row(f"{name}: seconds", [worst(r, kind, "seconds") for r in results], "{:.0f}")
    row("push: weights written", [r["push"] for r in results])
    row("checkpoint written", [r["checkpoint"] for r in results])
    row("peak of all phases", [peak_of(r) for r in results])
    return "\n".join(lines)


def baseline_tree(revision: str, folder: Path) -> Path:
    """The project's packages at `revision`, extracted into `folder`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, *PACKAGES],
        stdout=subprocess.PIPE,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--steps", default="wg", help="w: small, s: solver, g: generator group")
    parser.add_argument("--ways", default="baseline,fixed", help="of baseline, code, fixed")
    parser.add_argument("--baseline", default=BASELINE, help="the baseline way's commit")
    parser.add_argument("--way", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        print(json.dumps(run_way(args.way, args.code, args.model, args.steps)))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for way in args.ways.split(","):
            code = baseline_tree(args.baseline, Path(tmp)) if way == "baseline" else REPO
            done = subprocess.run(
                [sys.executable, __file__, "--way", way, "--code", str(code),
                 "--model", args.model, "--steps", args.steps],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )  # fmt: skip
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cpu = _cpu_name()
    print(
        f"{cpu}, {os.cpu_count()} cores; autocast {results[0]['autocast']}, attention "
        f"{results[0]['attention']}; steps {args.steps}; baseline {args.baseline}"
    )
    print(table(results))
    first, last = peak_of(results[0]), peak_of(results[-1])
    print(f"memory_peak_gib={last:.2f} memory_ratio={last / first:.2f}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
