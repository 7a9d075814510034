"""Trainer throughput beside TRL's GRPO trainer: same model, same batch, same run.

    python bench/bench_trainer.py [--model smollm2-135m-instruct] [--groups 2] [--group-size 4]
        [--max-new-tokens 64] [--micro-batch 4] [--rounds 3] [--checkpointing on|off|both]

Needs TRL (`pip install -e .[bench]`; `make bench` installs it).

1. Real graded groups, made once: `--groups` prompts from the seed environments (seeds/*.py,
   loaded in-process, minimum difficulty), rendered and wrapped in the model's chat template
   as the worker asks for them; `--group-size` completions each, sampled with transformers
   `generate` at temperature 1; each graded as the worker grades it (`extract_answer`, the
   seed's `score`, `grade_value`); the behaviour log-probs are the sampler's. A group whose
   rewards came out all equal (the small model rarely solves anything) would be skipped by
   both trainers, so its last completion is replaced by the reference answer (graded too)
   and the table says how many were.
2. One model, loaded by `evoenv_learner.trainer.Trainer` (float32 master weights, dropout
   off) and handed to TRL's `GRPOTrainer` as well, so both step the same weights with the same
   `torch.optim.AdamW` (memory: one copy of the model and of the optimiser state).
3. TRL runs its own training loop (`GRPOTrainer.train()`: dataloader, `training_step`,
   gradient clipping, optimiser and scheduler step) with `_generate_and_score_completions`
   overridden to return the same batch every step: the sequences `Trainer.build_sequences`
   makes of the groups, with their advantages and behaviour log-probs, padded as TRL pads
   them. Loss `dapo` (token-level clipped ratios, clip [1 - clip_low, 1 + clip_high], summed
   over the batch's completion tokens / their count), beta 0, the same micro-batch and
   gradient accumulation, gradient clipping, learning rate, gradient checkpointing setting
   (non-reentrant) and threads.
4. Interleaved: a TRL callback times each TRL optimiser step (on_step_begin to on_step_end)
   and then runs one `Trainer.step(groups)`, timed around the call. The first step of each is
   a warm-up; of the next `--rounds` the best and the median are kept.

Tokens are counted the same way for both: prompt + completion tokens of the batch, padding
excluded (`StepMetrics.total_tokens`). Prints one table and the ratio evoenv / TRL of tokens
per second (target: at least 1).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from benchkit import load_environment  # noqa: E402

from evoenv_learner.trainer import Trainer, TrainSequence  # noqa: E402
from evoenv_model.models import TEST_MODEL, prepare_model  # noqa: E402
from shared.config import GrpoSettings, Settings  # noqa: E402
from shared.environment import (  # noqa: E402
    ANSWER_CAP,
    Environment,
    Grade,
    build_prompt,
    extract_answer,
    grade_value,
    make_rng,
    seed_global_random,
)
from shared.messages import GradedCompletion, GradedGroup  # noqa: E402

TARGET = 1.0
"""evoenv tokens/s over TRL tokens/s, at least."""


# ------------------------------------------------------------------------------ the groups


def load_env(path: Path) -> tuple[Environment, str]:
    """The seed's environment (trusted code, loaded in-process) and its source's sha256."""
    env = load_environment(path, f"bench_{path.stem}")
    return env, hashlib.sha256(path.read_bytes()).hexdigest()


def grade(env: Environment, instance: Any, reference: Any, text: str) -> Grade:
    extraction = extract_answer(text, ANSWER_CAP)
    if extraction.answer is None:
        return Grade.format_error(extraction.problem)
    try:
        return grade_value(env.score(instance, reference, extraction.answer))
    except Exception as exc:  # noqa: BLE001 -- a seed should not raise; the worker counts it so
        return Grade.env_error(repr(exc))


@dataclass
class Made:
    groups: list[GradedGroup] = field(default_factory=list)
    injected: int = 0
    """Groups whose last completion was replaced by the reference answer."""
    seconds: float = 0.0


@torch.no_grad()
def make_groups(trainer: Trainer, args: argparse.Namespace) -> Made:
    """`args.groups` graded groups of `args.group_size` sampled completions each."""
    tokenizer = trainer.tokenizer
    assert tokenizer is not None
    model = trainer.model
    eos = {int(t) for t in _as_list(model.generation_config.eos_token_id)}
    eos.add(int(tokenizer.eos_token_id))
    temperature = trainer.temperatures["solver"]
    paths = sorted((REPO / "seeds").glob("*.py"))
    made = Made()
    begin = time.perf_counter()
    model.eval()
    torch.manual_seed(args.seed)
    problems = []
    for k in range(args.groups):
        env, sha = load_env(paths[(args.seed + k) % len(paths)])
        name, seed, difficulty = type(env).name, args.seed + k, env.min_difficulty
        seed_global_random(name, seed, difficulty)
        instance = env.sample(make_rng(name, seed, difficulty), difficulty)
        prompt = build_prompt(env.render(instance))
        prompt_ids = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        problems.append((env, sha, seed, instance, env.solve(instance), prompt, prompt_ids))
    # every completion of every group in one `generate` call, prompts left-padded
    width = max(len(p[-1]) for p in problems)
    rows = [p[-1] for p in problems for _ in range(args.group_size)]
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = model.generate(
        ids.to(trainer.device),
        attention_mask=mask.to(trainer.device),
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.max_new_tokens,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    sampled = out.sequences[:, width:].tolist()
    logits = torch.stack(out.logits, dim=1)  # [rows, steps, vocab]: the sampler's, unprocessed
    del out
    for k, (env, sha, seed, instance, reference, prompt, prompt_ids) in enumerate(problems):
        name, difficulty = type(env).name, env.min_difficulty
        completions = []
        for row in range(k * args.group_size, (k + 1) * args.group_size):
            tokens = sampled[row]
            end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            tokens = tokens[:end]
            text = str(tokenizer.decode(tokens, skip_special_tokens=True))
            result = grade(env, instance, reference, text)
            logps = torch.log_softmax(logits[row, : len(tokens)].float() / temperature, dim=-1)
            picked = logps.gather(-1, torch.tensor(tokens, device=logps.device)[:, None])
            completions.append(
                GradedCompletion(
                    text=text,
                    prompt_token_ids=prompt_ids,
                    token_ids=tokens,
                    logprobs=picked.squeeze(-1).tolist(),
                    finish_reason="stop" if tokens[-1] in eos else "length",
                    reward=result.reward,
                    outcome=result.outcome.value,
                    detail=result.detail,
                )
            )
        rewards = {c.reward for c in completions if c.reward is not None}
        if len(rewards) < 2:
            # no variance: both trainers would skip the group; make it trainable with one
            # completion that differs (the reference answer, or a non-answer if all were right)
            made.injected += 1
            text = (
                f"<answer>{env.answer_text(reference)}</answer>"
                if rewards != {1.0}
                else "I do not know."
            )
            tokens = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            result = grade(env, instance, reference, text)
            completions[-1] = GradedCompletion(
                text=text,
                prompt_token_ids=prompt_ids,
                token_ids=tokens,
                logprobs=trainer.completion_logprobs(prompt_ids, tokens),
                finish_reason="stop",
                reward=result.reward,
                outcome=result.outcome.value,
                detail=result.detail,
            )
        made.groups.append(
            GradedGroup(
                run="bench",
                group_id=f"bench-{k}",
                role="solver",
                env_name=name,
                env_sha=sha,
                seed=seed,
                difficulty=difficulty,
                prompt=prompt,
                policy_version=0,
                completions=completions,
            )
        )
    model.train()
    made.seconds = time.perf_counter() - begin
    return made


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


# ------------------------------------------------------------------------------------ TRL


def trl_batch(sequences: list[TrainSequence], pad_id: int) -> dict[str, torch.Tensor]:
    """The dict `GRPOTrainer._generate_and_score_completions` returns, for these sequences:
    prompts left-padded, completions right-padded, to the batch's longest."""
    size = len(sequences)
    prompt_len = max(len(s.prompt) for s in sequences)
    completion_len = max(len(s.completion) for s in sequences)
    prompt_ids = torch.full((size, prompt_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(size, prompt_len, dtype=torch.long)
    completion_ids = torch.full((size, completion_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros(size, completion_len, dtype=torch.long)
    old = torch.zeros(size, completion_len, dtype=torch.float32)
    for row, seq in enumerate(sequences):
        p, c = len(seq.prompt), len(seq.completion)
        prompt_ids[row, prompt_len - p :] = torch.tensor(seq.prompt)
        prompt_mask[row, prompt_len - p :] = 1
        completion_ids[row, :c] = torch.tensor(seq.completion)
        completion_mask[row, :c] = 1
        old[row, :c] = torch.tensor(seq.old_logprobs)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([s.advantage for s in sequences], dtype=torch.float32),
        "old_per_token_logps": old,
        "num_items_in_batch": completion_mask.sum(),
    }


def no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    """The reward function TRL requires; never called (generation and scoring are ours)."""
    return [0.0] * len(completions)


@dataclass
class Timings:
    seconds: list[float] = field(default_factory=list)
    """Wall-clock seconds per optimiser step."""
    cpu: list[float] = field(default_factory=list)
    """CPU seconds of this process (all threads) per optimiser step."""
    losses: list[float] = field(default_factory=list)


def run_phase(
    trainer: Trainer,
    groups: list[GradedGroup],
    batch: dict[str, torch.Tensor],
    args: argparse.Namespace,
    checkpointing: bool,
    tokens: int,
) -> tuple[Timings, Timings]:
    """`args.rounds + 1` interleaved optimiser steps of TRL and of `trainer` on the same
    model; the timings of each (warm-up step included, first)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    settings = trainer.settings
    sequences = int(batch["advantages"].shape[0])
    ours, theirs = Timings(), Timings()
    if checkpointing:
        trainer.model.gradient_checkpointing_enable({"use_reentrant": False})
    else:
        trainer.model.gradient_checkpointing_disable()

    class FixedBatchGRPO(GRPOTrainer):
        """TRL's trainer with its generation and scoring replaced by our fixed batch."""

        step_loss = 0.0

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            return {key: value.to(self.accelerator.device) for key, value in batch.items()}

        def training_step(
            self, model: Any, inputs: Any, num_items_in_batch: Any = None
        ) -> torch.Tensor:
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.step_loss += float(loss)
            return loss

    class Interleave(TrainerCallback):
        """Times TRL's optimiser steps; after each, times one step of ours."""

        start = cpu_start = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            trl_trainer.step_loss = 0.0
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            theirs.seconds.append(time.perf_counter() - self.start)
            theirs.cpu.append(time.process_time() - self.cpu_start)
            theirs.losses.append(trl_trainer.step_loss)
            begin, cpu_begin = time.perf_counter(), time.process_time()
            metrics = trainer.step(groups)
            ours.seconds.append(time.perf_counter() - begin)
            ours.cpu.append(time.process_time() - cpu_begin)
            ours.losses.append(metrics.loss if metrics.stepped else math.nan)
            if metrics.total_tokens != tokens:
                raise SystemExit(f"our step saw {metrics.total_tokens} tokens, not {tokens}")
            print(
                f"  step {len(ours.seconds)}: TRL {theirs.seconds[-1]:.2f} s "
                f"({theirs.cpu[-1]:.1f} s CPU), evoenv {ours.seconds[-1]:.2f} s "
                f"({ours.cpu[-1]:.1f} s CPU)",
                file=sys.stderr,
                flush=True,
            )

    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=settings.micro_batch,
            gradient_accumulation_steps=sequences // settings.micro_batch,
            num_generations=args.group_size,
            max_steps=args.rounds + 1,
            learning_rate=settings.learning_rate,
            weight_decay=settings.weight_decay,
            max_grad_norm=settings.max_grad_norm,
            lr_scheduler_type="constant",
            warmup_steps=0,
            loss_type="dapo",
            beta=0.0,
            epsilon=settings.clip_low,
            epsilon_high=settings.clip_high,
            temperature=settings.temperature,
            max_completion_length=args.max_new_tokens + 16,
            mask_truncated_completions=False,
            disable_dropout=True,
            bf16=trainer.autocast,  # ours autocasts to bf16 on CUDA with float32 weights
            gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            use_cpu=trainer.device.type == "cpu",
            report_to="none",
            save_strategy="no",
            logging_steps=10_000,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=args.seed,
        )
        trl_trainer = FixedBatchGRPO(
            model=trainer.model,
            reward_funcs=no_reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": [g.prompt for g in groups]}),
            processing_class=trainer.tokenizer,
            optimizers=(trainer.optimizer, None),
            callbacks=[Interleave()],
        )
        trl_trainer.train()
    return ours, theirs


# ------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=TEST_MODEL, help="embedded model or folder")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "evoenv")
    parser.add_argument("--groups", type=int, default=2, help="prompts (groups) in the batch")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each (after one)")
    parser.add_argument(
        "--checkpointing", choices=("on", "off", "both"), default="on",
        help="gradient checkpointing (the learner's default: on)",
    )  # fmt: skip
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    warnings.filterwarnings("ignore", message=".*vLLM versions.*")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    folder = prepare_model(Settings(model=args.model, data_dir=args.data_dir))
    settings = GrpoSettings(group_size=args.group_size, micro_batch=args.micro_batch)
    trainer = Trainer(
        folder,
        settings,
        param_dtype=getattr(torch, args.dtype),
        gradient_checkpointing=args.checkpointing != "off",
    )
    tokenizer = trainer.tokenizer
    assert tokenizer is not None

    made = make_groups(trainer, args)
    sequences, skipped, env_errors = trainer.build_sequences(made.groups)
    if skipped or env_errors or len(sequences) % settings.micro_batch:
        raise SystemExit(
            f"{len(sequences)} trainable sequences ({skipped} groups skipped, {env_errors} "
            f"env errors): need a multiple of the micro-batch {settings.micro_batch}"
        )
    tokens = sum(len(s.prompt) + len(s.completion) for s in sequences)
    completion_tokens = sum(len(s.completion) for s in sequences)
    # at ratio 1 (weights as sampled) the loss is minus the token-weighted mean advantage
    on_policy_loss = -sum(s.advantage * len(s.completion) for s in sequences) / completion_tokens
    batch = trl_batch(sequences, int(tokenizer.pad_token_id))
    rewards = [c.reward for g in made.groups for c in g.completions if c.reward is not None]
    print(
        f"{len(made.groups)} groups x {args.group_size} from {', '.join(g.env_name for g in made.groups)} "
        f"(sampled and graded in {made.seconds:.0f} s; mean reward {statistics.fmean(rewards):.2f}; "
        f"{made.injected} needed the reference answer for reward variance)",
        file=sys.stderr,
        flush=True,
    )

    phases = {"on": [True], "off": [False], "both": [True, False]}[args.checkpointing]
    rows = []
    for checkpointing in phases:
        ours, theirs = run_phase(trainer, made.groups, batch, args, checkpointing, tokens)
        rows.append((checkpointing, ours, theirs))
    print_table(
        rows, args, folder.name, len(sequences), tokens, completion_tokens, made, on_policy_loss
    )


def print_table(
    rows: list[tuple[bool, Timings, Timings]],
    args: argparse.Namespace,
    model: str,
    sequences: int,
    tokens: int,
    completion_tokens: int,
    made: Made,
    on_policy_loss: float,
) -> None:
    print(
        f"\n{model}, {args.dtype}, {args.threads} threads, {'CUDA' if torch.cuda.is_available() else 'CPU'}; "
        f"one optimiser step = {len(made.groups)} groups x {args.group_size} = {sequences} sequences, "
        f"micro-batch {args.micro_batch}, {tokens} tokens (prompt + completion, no padding; "
        f"{completion_tokens} completion tokens); {made.injected} of {len(made.groups)} groups "
        f"got the reference answer for reward variance. Best and median of {args.rounds} "
        "interleaved steps after one warm-up step each (TRL's first).\n"
        f"Loss at the sampling weights (importance ratio 1): {on_policy_loss:+.5f}; TRL's first "
        "step runs there, ours after one TRL update.\n"
    )
    header = (
        "checkpointing",
        "evoenv s/step (best, median)",
        "TRL s/step (best, median)",
        "evoenv tok/s",
        "TRL tok/s",
        "evoenv/TRL",
        "loss, first step (evoenv, TRL)",
        "losses finite",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for checkpointing, ours, theirs in rows:
        best_ours, best_theirs = min(ours.seconds[1:]), min(theirs.seconds[1:])
        ratio = best_theirs / best_ours
        finite = all(math.isfinite(x) for x in ours.losses + theirs.losses)
        cells = (
            "on" if checkpointing else "off",
            f"{best_ours:.2f}, {statistics.median(ours.seconds[1:]):.2f}",
            f"{best_theirs:.2f}, {statistics.median(theirs.seconds[1:]):.2f}",
            f"{tokens / best_ours:,.0f}",
            f"{tokens / best_theirs:,.0f}",
            f"{ratio:.2f}x {'ok' if ratio >= TARGET else 'MISS'}",
            f"{ours.losses[0]:+.5f}, {theirs.losses[0]:+.5f}",
            "yes" if finite else "NO",
        )
        print("| " + " | ".join(cells) + " |")
    print(f"\ntarget: evoenv/TRL tokens per second >= {TARGET:g}x")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
