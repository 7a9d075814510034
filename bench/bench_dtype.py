"""The learner's optimiser step in each precision this CPU could train in: same model, same batch.

    python bench/bench_dtype.py [--model qwen2.5-coder-0.5b-instruct] [--groups 2]
        [--group-size 4] [--prompt-tokens 200] [--completion-tokens 384] [--rounds 2]

Three ways, one after the other in one run (each after a warm-up step; the best and the
median of `--rounds` timed steps kept; peak memory from the process's high-water mark, which
only rises, so the ways run from the least hungry up):
- `bf16 weights`: parameters and AdamW state in bfloat16 (`param_dtype=torch.bfloat16`);
- `fp32 + bf16 autocast`: float32 master weights, the forward pass under CPU autocast to
  bfloat16 (`autocast_dtype=torch.bfloat16`);
- `fp32`: float32 throughout (the learner's default on a CPU without native bfloat16).
The batch is the one `evoenv up` steps on a CPU (2 groups of 4, micro-batches of 1): random
token ids of the given lengths, rewards 0/1 alternating, behaviour log-probs the fp32
model's own. Prints the table, the CPU's model name and whether it has native bfloat16, and
the step-time ratios against fp32.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from evoenv_learner.trainer import Trainer  # noqa: E402
from evoenv_model.models import DEFAULT_MODEL, prepare_model  # noqa: E402
from shared.config import GrpoSettings, Settings  # noqa: E402
from shared.hardware import cpu_flags, cpu_model_name, native_bf16  # noqa: E402
from shared.messages import GradedCompletion, GradedGroup  # noqa: E402


def make_groups(
    trainer: Trainer,
    groups: int,
    size: int,
    prompt_len: int,
    completion_len: int,
    completion_max: int | None = None,
) -> list[GradedGroup]:
    """Random prompts and completions (each of `completion_len` tokens, or of a length drawn
    from [completion_len, completion_max]), rewards 0/1 alternating, the model's log-probs."""
    rng = random.Random(0)
    vocab = trainer.model.config.vocab_size
    out = []
    for g in range(groups):
        prompt = [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]
        completions = []
        for i in range(size):
            length = rng.randint(completion_len, completion_max or completion_len)
            tokens = [rng.randrange(100, vocab - 100) for _ in range(length)]
            completions.append(
                GradedCompletion(
                    text="x",
                    prompt_token_ids=prompt,
                    token_ids=tokens,
                    logprobs=trainer.completion_logprobs(prompt, tokens, "solver"),
                    finish_reason="length",
                    reward=float(i % 2),
                    outcome="scored",
                )
            )
        out.append(
            GradedGroup(
                run="bench",
                group_id=f"g{g}",
                role="solver",
                env_name="e",
                env_sha="0" * 64,
                seed=g,
                difficulty=1,
                prompt="p",
                policy_version=0,
                completions=completions,
            )
        )
    return out


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--completion-tokens", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    model = prepare_model(Settings(model=args.model))
    grpo = GrpoSettings(micro_batch=1, learning_rate=1e-6)
    flags = cpu_flags()
    print(f"CPU: {cpu_model_name()}; native bfloat16: {'yes' if native_bf16(flags) else 'no'}")

    reference = Trainer(model, grpo, device="cpu")
    groups = make_groups(
        reference, args.groups, args.group_size, args.prompt_tokens, args.completion_tokens
    )
    del reference
    gc.collect()

    ways = {
        "bf16 weights": {"param_dtype": torch.bfloat16},
        "fp32 + bf16 autocast": {"autocast_dtype": torch.bfloat16},
        "fp32": {},
    }
    rows = []
    for label, kwargs in ways.items():
        trainer = Trainer(model, grpo, device="cpu", **kwargs)  # type: ignore[arg-type]
        trainer.step(groups)  # warm-up
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            trainer.step(groups)
            times.append(time.perf_counter() - start)
        rows.append((label, min(times), statistics.median(times), peak_gib()))
        del trainer
        gc.collect()

    base = next(r for r in rows if r[0] == "fp32")
    tokens = args.groups * args.group_size * (args.prompt_tokens + args.completion_tokens)
    print(f"\nbatch: {args.groups} groups x {args.group_size}, {tokens} tokens a step")
    print(
        f"{'way':<22} {'best s':>8} {'median s':>9} {'tokens/s':>9} {'peak GiB':>9} {'vs fp32':>8}"
    )
    for label, best, median, peak in rows:
        print(
            f"{label:<22} {best:8.1f} {median:9.1f} {tokens / best:9.0f} {peak:9.1f} "
            f"{best / base[1]:7.2f}x"
        )


if __name__ == "__main__":
    main()
