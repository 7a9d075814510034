"""The learner's optimiser step on one NVIDIA GPU at thinking-model lengths: today's path
(each micro-batch one row per sequence, padded to the longest) beside packed sequences
(`grpo.pack`), and what activation checkpointing and chunked log-probs each cost; or full
fine-tuning beside LoRA (`--lora`). Step seconds, tokens/s, peak memory and MFU.

    python bench/bench_gpu_trainer.py [--model qwen3-4b] [--groups 2] [--group-size 4]
        [--prompt-tokens 1000] [--completion-min 4000] [--completion-max 8000]
        [--micro-batch 4] [--rounds 2] [--peak-tflops 989] [--profile] [--lora] [--tiny]

Meant for a GPU machine with torch and nothing to download: the model is the named
architecture (its published config.json, written here: Qwen3-4B, or the embedded
Qwen2.5-Coder-0.5B) with random weights, which time the same as trained ones, loaded by the
project's `Trainer` as the learner loads it (bfloat16 autocast over float32 master weights,
fused AdamW: about 16 bytes a weight). The batch: random token ids, each completion's length
drawn from [--completion-min, --completion-max], rewards 0/1 alternating, behaviour
log-probs the model's own. Each way after a warm-up step; the median of `--rounds` timed
steps (synchronised).

MFU, one way throughout: model FLOPs of the non-padding tokens over the whole step's seconds
(optimiser included) over `--peak-tflops` (the card's dense bfloat16 peak; default 989, an
H100 or H200 SXM). Model FLOPs: 6 N a token for full fine-tuning (forward 2 N, backward 4 N),
4 N with LoRA (no weight gradients of the frozen base), N the weights of the matrix products
(every Linear, the tied LM head included, the embedding lookup excluded); plus causal
attention, 6 x layers x (heads x head size) x L^2 per sequence of L tokens (scores and
values, forward and backward, half the square). Recomputation under activation
checkpointing counts nothing (it is the cost of the memory saved). `--profile` prints where
one packed step's GPU time goes (torch.profiler, the top operators).

On a machine without CUDA it runs on the CPU with `--tiny` (a two-layer model of the same
shape family, small widths) to check that it works; figures from it mean nothing. What the
GPU machine needs beside torch, transformers, safetensors and peft: the project's
pure-Python dependencies the trainer imports (pydantic, pydantic-settings, structlog).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from bench_dtype import make_groups  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from evoenv_learner.trainer import Trainer  # noqa: E402
from shared.config import GrpoSettings  # noqa: E402
from shared.messages import GradedGroup  # noqa: E402

QWEN_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
}
"""Qwen2.5-Coder-0.5B-Instruct's architecture (the embedded model's config.json)."""
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_theta": 5000000.0,
    "torch_dtype": "bfloat16",
}
"""Qwen3-4B-Thinking-2507's architecture (its published config.json; 4.0B weights)."""
MODELS = {"qwen3-4b": QWEN3_4B, "qwen2.5-0.5b": QWEN_05B}
TINY = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 4096,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}  # fmt: skip
WAYS = {
    "today": {"pack": False},
    "packed": {"pack": True},
    "packed no checkpointing": {"pack": True, "gradient_checkpointing": False},
    "packed whole logits": {"pack": True},
    "packed flex attention": {"pack": True, "attention": "flex_attention"},
}
"""Each way's settings; "whole logits" also switches the chunked log-probs off."""


def model_folder(folder: Path, config: dict[str, Any]) -> Path:
    """A random-weight model of `config` in `folder`."""
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    model.save_pretrained(folder)
    return folder


def matmul_weights(model: torch.nn.Module) -> int:
    """N: the weights of the base model's matrix products (every Linear, the tied LM head
    included; a LoRA adapter's own left out)."""
    return sum(
        module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and "lora_" not in name
    )


def attention_flops(config: Any, lengths: list[int]) -> float:
    """Causal attention's FLOPs for sequences of `lengths`, forward and backward."""
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = config.num_attention_heads * head
    return sum(6 * config.num_hidden_layers * width * n * n for n in lengths)


def timed_steps(trainer: Trainer, groups: list[Any], rounds: int) -> float:
    def sync() -> None:
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()

    trainer.step(groups)  # warm-up
    times = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        trainer.step(groups)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_step(trainer: Trainer, groups: list[Any]) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if trainer.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        trainer.step(groups)
    key = "cuda_time_total" if trainer.device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-4b")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--completion-min", type=int, default=4000)
    parser.add_argument("--completion-max", type=int, default=8000)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated, of: " + ", ".join(WAYS)
    )
    parser.add_argument("--lora", action="store_true", help="full beside LoRA, today's path")
    parser.add_argument("--profile", action="store_true", help="where a packed step's time goes")
    parser.add_argument("--tiny", action="store_true", help="a two-layer model (a CPU check)")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (a check, not a figure)"
    config = dict(MODELS[args.model], **(TINY if args.tiny else {}))
    if args.lora:
        ways = {"full": {"pack": False}, f"LoRA r={args.rank}": {"lora_rank": args.rank}}
    else:
        ways = {way: WAYS[way] for way in args.ways.split(",")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp), config)
        groups: list[GradedGroup] = []
        for label, overrides in ways.items():
            settings = GrpoSettings.model_validate(
                {
                    "micro_batch": args.micro_batch,
                    "group_size": args.group_size,
                    "batch_groups": args.groups,
                    "gradient_checkpointing": True,
                    "max_tokens": args.completion_max,
                    **overrides,
                }
            )
            trainer = Trainer(folder, settings, device=device)
            if label.endswith("whole logits"):
                trainer.chunked_head = False
            groups = groups or make_groups(
                trainer,
                args.groups,
                args.group_size,
                args.prompt_tokens,
                args.completion_min,
                args.completion_max,
            )
            lengths = [
                len(c.prompt_token_ids) + len(c.token_ids) for g in groups for c in g.completions
            ]
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                seconds = timed_steps(trainer, groups, args.rounds)
            except (torch.OutOfMemoryError, NotImplementedError, RuntimeError) as exc:
                why = "out of memory" if isinstance(exc, torch.OutOfMemoryError) else str(exc)
                rows.append((label, None, 0.0, 0.0, 0.0))
                print(f"{label}: {why.splitlines()[0][:200]}")
            else:
                n = matmul_weights(trainer.model)
                per_token = 6 if not settings.lora_rank else 4
                flops = per_token * n * sum(lengths) + attention_flops(
                    trainer.model.config, lengths
                )
                peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
                mfu = flops / seconds / (args.peak_tflops * 1e12)
                rows.append((label, seconds, sum(lengths) / seconds, mfu, peak))
                if args.profile and label == "packed":
                    profile_step(trainer, groups)
            del trainer
            if device == "cuda":
                torch.cuda.empty_cache()

    tokens = sum(len(c.prompt_token_ids) + len(c.token_ids) for g in groups for c in g.completions)
    print(f"\n{name}, torch {torch.__version__}: {args.model}{' (tiny)' if args.tiny else ''}, "
          f"one step of {args.groups} groups x {args.group_size} ({tokens} tokens: prompts of "
          f"{args.prompt_tokens}, completions of {args.completion_min}-{args.completion_max}), "
          f"micro-batches of {args.micro_batch}, bf16 autocast, float32 AdamW")  # fmt: skip
    print(f"{'way':<26} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'vs first':>9}")
    base = rows[0][1]
    cpu = device == "cpu"
    for label, seconds, rate, mfu, peak in rows:
        if seconds is None:
            print(f"{label:<26} {'failed (above)':>8}")
            continue
        ratio = f"{seconds / base:8.2f}x" if base else "-"
        memory = "-" if cpu else f"{peak:.1f}"  # the CUDA allocator's peak
        print(f"{label:<26} {seconds:8.2f} {rate:10.0f} {mfu:7.1%} {memory:>9} {ratio:>9}")


if __name__ == "__main__":
    main()
