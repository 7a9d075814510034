"""The learner's optimiser step on one NVIDIA GPU, full fine-tuning beside LoRA: step time and
model FLOPs utilisation (MFU) for the embedded model's architecture.

    python bench/bench_gpu_trainer.py [--groups 8] [--group-size 8] [--prompt-tokens 256]
        [--completion-tokens 512] [--rank 16] [--rounds 3] [--peak-tflops 989]

Meant for a GPU machine with torch and nothing to download: the model is Qwen2.5-Coder-0.5B's
architecture (its config, written here) with random weights, which time the same as trained
ones, saved to a temporary folder and loaded by the project's `Trainer` as the learner loads
it (bfloat16 autocast, float32 master weights and AdamW). The batch: random token ids of the
given lengths, rewards 0/1 alternating, behaviour log-probs the model's own. Each way after a
warm-up step; the median of `--rounds` timed steps (synchronised).

MFU = model FLOPs / step seconds / peak. Model FLOPs per token: 6 N (forward 2 N, backward
4 N) for full fine-tuning, where N is the number of weights in the matrix products (the
embedding lookup excluded, the tied LM head included); 4 N with LoRA (the frozen base needs
the gradients of its activations but not of its weights; the adapter's own FLOPs, under 1%,
are left out); attention's score FLOPs are added for both (12 x layers x hidden x sequence
per token, causal halving ignored). `--peak-tflops`: the GPU's dense bfloat16 peak (default
989, an H100 or H200 SXM's). On a machine without CUDA it runs on the CPU with `--tiny` (a
two-layer model) to check that it works; figures from it mean nothing.

What the GPU machine needs beside torch, transformers, safetensors and peft: the project's
pure-Python dependencies the trainer imports (pydantic, pydantic-settings, structlog), carried
as wheels where nothing can be installed. Figures from one H200: docs/results.md (LoRA beside
full fine-tuning).
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


def model_folder(folder: Path, tiny: bool) -> Path:
    """A random-weight model of the embedded architecture (or a two-layer one) in `folder`."""
    config = dict(QWEN_05B, num_hidden_layers=2, vocab_size=4096) if tiny else QWEN_05B
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--completion-tokens", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--tiny", action="store_true", help="a two-layer model (a CPU check)")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (a check, not a figure)"
    sequence = args.prompt_tokens + args.completion_tokens
    tokens = args.groups * args.group_size * sequence
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp), args.tiny)
        for label, rank in (("full", 0), (f"LoRA r={args.rank}", args.rank)):
            settings = GrpoSettings(
                micro_batch=args.micro_batch,
                group_size=args.group_size,
                batch_groups=args.groups,
                lora_rank=rank,
                gradient_checkpointing=False,
            )
            trainer = Trainer(folder, settings, device=device)
            config = trainer.model.config
            n = matmul_weights(trainer.model)
            groups = make_groups(
                trainer, args.groups, args.group_size, args.prompt_tokens, args.completion_tokens
            )
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds = timed_steps(trainer, groups, args.rounds)
            attention = 12 * config.num_hidden_layers * config.hidden_size * sequence
            flops = ((6 if rank == 0 else 4) * n + attention) * tokens
            peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
            mfu = flops / seconds / (args.peak_tflops * 1e12)
            rows.append((label, seconds, tokens / seconds, mfu, peak_gib))
            del trainer
            if device == "cuda":
                torch.cuda.empty_cache()

    print(f"\n{name}: one step of {args.groups} groups x {args.group_size}, {sequence} tokens "
          f"each ({tokens} tokens), micro-batches of {args.micro_batch}, bf16 autocast")  # fmt: skip
    print(f"{'way':<12} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'vs full':>8}")
    for label, seconds, rate, mfu, peak in rows:
        print(f"{label:<12} {seconds:8.2f} {rate:10.0f} {mfu:7.1%} {peak:9.1f}"
              f" {seconds / rows[0][1]:7.2f}x")  # fmt: skip
    full, lora = rows
    print(f"gpu-trainer: full_step_s={full[1]:.3f} lora_step_s={lora[1]:.3f} "
          f"full_mfu={full[3]:.3f} lora_mfu={lora[3]:.3f} lora_step_ratio={lora[1] / full[1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
