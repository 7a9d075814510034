"""The policy in torch and one GRPO optimiser step over graded groups (`Trainer.step`).

Synchronous throughout; the asyncio learner calls it through `asyncio.to_thread`. What a step
does: docs/DESIGN.md#trainer.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from evoenv_learner.checkpoints import (
    CHECKPOINT_PREFIX,
    STATE_FILE,
    atomic_dir,
    disk_full_as_error,
    latest_checkpoint,
    list_checkpoints,
    require_space,
    rng_state,
    set_rng_state,
    tensor_bytes,
)
from evoenv_learner.distributed import DataParallel
from evoenv_learner.grpo import (
    Role,
    group_advantages,
    grpo_loss,
    role_token_weights,
    token_entropy,
    token_logprobs,
)
from evoenv_learner.logprobs import head_logprobs
from evoenv_learner.lora import (
    ADAPTER_DIR,
    check_mode,
    load_adapter,
    merged_model,
    mode_record,
    save_adapter,
    with_lora,
    write_adapter,
)
from shared.config import GrpoSettings
from shared.errors import UsageError
from shared.messages import GradedGroup

log = structlog.get_logger(__name__)

SHARDS_DIR = "shards"
"""A sharded checkpoint's weights and optimiser state (torch.distributed.checkpoint)."""
ENTROPY_CHUNK = 256
"""Rows of logits per chunk when computing the entropy metric (bounds its memory)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


@dataclass(frozen=True, slots=True)
class TrainSequence:
    """One completion ready for training: token ids exactly as sampled."""

    prompt: list[int]
    completion: list[int]
    old_logprobs: list[float]
    """Behaviour log-probs, one per completion token."""
    advantage: float
    temperature: float
    role: Role = "solver"
    """The role of its group."""
    token_weight: float = 0.0
    """What each of its completion tokens weighs in the step's loss (`role_token_weights`)."""


@dataclass(slots=True)
class StepMetrics:
    """What one call of `Trainer.step` did; `as_dict()` flattens it for a log line."""

    step: int
    """Optimiser steps taken so far (after this call)."""
    stepped: bool
    """False when nothing was trainable (every group skipped) or the gradient was not finite."""
    loss: float = 0.0
    policy_loss: float = 0.0
    groups: int = 0
    skipped_groups: int = 0
    """Groups with no reward variance among their valid members."""
    sequences: int = 0
    env_error_completions: int = 0
    tokens: int = 0
    """Completion tokens that carried loss."""
    total_tokens: int = 0
    """Prompt and completion tokens run through the model."""
    reward_mean: dict[str, float] = field(default_factory=dict)
    """By role, over every valid completion of every group given (skipped ones included)."""
    reward_std: dict[str, float] = field(default_factory=dict)
    clip_fraction: float = 0.0
    ratio_mean: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    nonfinite_grad: bool = False
    learning_rate: float = 0.0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    """total_tokens / seconds: prompt and completion tokens through forward and backward."""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("reward_mean", "reward_std"):
            for role, value in data.pop(name).items():
                data[f"{name}_{role}"] = value
        return data


class StepInterrupted(Exception):
    """`Trainer.interrupt` was set during a step: the step was abandoned between micro-batches
    (gradients dropped, weights and optimiser untouched)."""


class Trainer:
    """A causal LM loaded from a local Hugging Face folder, trained with role-conditioned GRPO.

    Setting `interrupt` (from any thread) abandons the step in progress at the next
    micro-batch with `StepInterrupted`: on a CPU a step takes minutes, and a person who asked
    to stop should not wait for it. Ignored under data parallelism (the ranks would hang).

    Precision: master weights in float32 by default; the passes run under bf16 autocast on
    CUDA and on a CPU with native bfloat16 (`grpo.compute_dtype` decides; float32 elsewhere).
    `param_dtype=torch.bfloat16` halves memory (on a CPU, too) at the cost of updates smaller
    than bf16's resolution being lost. Dropout is switched off: the importance ratios compare
    deterministic forward passes.

    Sharded data parallel (`parallel`, see `distributed.py`): the model, its gradients and
    AdamW's state are sharded across the ranks (FSDP2). Rank 0's `step`, `save_checkpoint`,
    `load_checkpoint` and `weights_for_push` first send the command to the other ranks, which
    run `follow()`; each rank runs its share of the micro-batches (every rank as many), and
    the figures are summed across the ranks before the optimiser step. Checkpoints are written
    as shards (torch.distributed.checkpoint), which one process can load too; LoRA trains in
    one process only.

    LoRA (`settings.lora_rank` > 0, `lora` true; see `lora.py`): the model is wrapped with a
    peft LoRA adapter on `settings.lora_target_modules`; the base weights stay frozen and AdamW
    holds the adapter's only. The KL reference is the same model with the adapter switched off
    (no second copy). Checkpoints hold the adapter, not the model; `save_adapter_for_push`
    writes it for vLLM's LoRA loader and `export_hf` writes the merged weights.
    """

    def __init__(
        self,
        model_path: str | Path,
        settings: GrpoSettings,
        *,
        device: str | torch.device | None = None,
        param_dtype: torch.dtype = torch.float32,
        autocast_dtype: torch.dtype | None = None,
        temperatures: Mapping[str, float] | None = None,
        gradient_checkpointing: bool | None = None,
        compute_entropy: bool = True,
        parallel: DataParallel | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.parallel = parallel
        self.settings = settings
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.temperatures = {
            "solver": settings.temperature,
            "generator": settings.generator_temperature,
        }
        self.temperatures.update(temperatures or {})
        self.compute_entropy = compute_entropy
        if autocast_dtype is None and param_dtype == torch.float32:
            autocast_dtype = _compute_dtype(settings, self.device)
        self.autocast_dtype = autocast_dtype
        self.source_dtype = _config_dtype(self.model_path) or param_dtype
        self.step_count = 0
        self.interrupt = threading.Event()
        self.lora = settings.lora_rank > 0
        """Only a LoRA adapter is trained (the base weights are frozen)."""

        if parallel is not None and self.lora:
            raise UsageError(
                "LoRA trains in one process (EVOENV_GRPO__LORA_RANK="
                f"{settings.lora_rank} with {parallel.world} ranks): run the learner without "
                "torchrun, or set EVOENV_GRPO__LORA_RANK=0 for sharded full fine-tuning"
            )
        self.model = self._load_model(param_dtype)
        if self.lora:
            self.model = with_lora(self.model, settings, self.device)
        self.chunked_head = _head_is_plain(self.model)
        self.tied = _tied_names(self.model)
        """Names of weights that are another weight (the head tied to the embeddings)."""
        self.model.train()
        if _checkpointing(gradient_checkpointing, settings):
            self.model.gradient_checkpointing_enable({"use_reentrant": False})
        self.reference = (
            self._load_model(param_dtype).eval() if settings.kl_coef > 0 and not self.lora else None
        )
        """The frozen starting policy of the KL term in full fine-tuning (LoRA mode gets it by
        switching the adapter off: None there, as without a KL term)."""
        if self.reference is not None:
            self.reference.requires_grad_(False)
        self._passes: dict[int, _Passes] = {}
        """Under sharding, each model's log-prob pass as the root module FSDP2 wraps."""
        if parallel is not None:
            for model in (self.model, self.reference):
                if model is not None:
                    passes = _Passes(model, self._logprobs_of)
                    parallel.shard(passes, _blocks(model))
                    self._passes[id(model)] = passes
        self.tokenizer = (
            AutoTokenizer.from_pretrained(self.model_path)
            if any((self.model_path / name).is_file() for name in TOKENIZER_FILES)
            else None
        )
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        """What the optimiser updates: every weight, or the adapter's in LoRA mode. Taken once
        here: peft flips `requires_grad` while the adapter is switched off."""
        self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            self.trainable,
            lr=settings.learning_rate,
            weight_decay=settings.weight_decay,
            fused=self.device.type in ("cpu", "cuda") or None,
        )
        """Fused: one kernel a tensor, no temporaries (the per-tensor loop made two of each
        moment's size: 1.1 GiB for the 0.5B model's embeddings; docs/results.md#learner-memory)."""

    def _load_model(self, dtype: torch.dtype) -> Any:
        given = {"attn_implementation": self.settings.attention} if self.settings.attention else {}
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype, **given)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model.to(self.device)

    # ------------------------------------------------------------------------------ training

    def step(self, groups: Sequence[GradedGroup]) -> StepMetrics:
        """One optimiser step over `groups` (gradient accumulation over micro-batches).

        Top to bottom: advantages per group (zero-variance groups skipped and counted) ->
        sequences (prompt_token_ids + token_ids as they came from the server, never
        re-tokenised; `env_error` completions left out) -> micro-batches, each a forward pass at
        the training temperature, the GRPO loss over completion tokens only, backward (gradients
        accumulate over the whole batch; each role's loss is the mean over its own tokens, the
        roles weighed by their share of the batch's sequences) -> gradient clipping -> one
        AdamW step.
        """
        if self.parallel is not None and self.parallel.leader:
            self.parallel.broadcast(("step", list(groups)))
        return self._step(groups)

    def follow(self) -> None:
        """A rank other than 0: carry out rank 0's commands until it sends stop."""
        assert self.parallel is not None and not self.parallel.leader
        log.info("follower_ready", rank=self.parallel.rank)
        while True:
            command = self.parallel.broadcast()
            if command[0] == "step":
                self._step(command[1])
            elif command[0] == "load":
                self._load_checkpoint(command[1])
            elif command[0] == "save":
                self._save_shards(Path(command[1]))
            elif command[0] == "gather":
                self._full_weights()
            else:
                log.info("follower_stopped", rank=self.parallel.rank, step=self.step_count)
                return

    def close(self) -> None:
        """Rank 0: tell the other ranks to stop (nothing to do in one process)."""
        if self.parallel is not None and self.parallel.leader:
            self.parallel.broadcast(("stop",))

    def _step(self, groups: Sequence[GradedGroup]) -> StepMetrics:
        start = time.perf_counter()
        sequences, skipped, env_errors = self.build_sequences(groups)
        metrics = StepMetrics(
            step=self.step_count,
            stepped=False,
            groups=len(groups),
            skipped_groups=skipped,
            sequences=len(sequences),
            env_error_completions=env_errors,
            tokens=sum(len(seq.completion) for seq in sequences),
            learning_rate=self.optimizer.param_groups[0]["lr"],
        )
        metrics.reward_mean, metrics.reward_std = reward_stats(groups)
        if sequences:
            self.optimizer.zero_grad(set_to_none=True)
            size = self.settings.micro_batch
            chunks = [sequences[first : first + size] for first in range(0, len(sequences), size)]
            mine = self.parallel.mine(len(chunks)) if self.parallel else range(len(chunks))
            for index in mine:
                if self.interrupt.is_set() and self.parallel is None:
                    self.optimizer.zero_grad(set_to_none=True)
                    raise StepInterrupted(f"step {self.step_count + 1} abandoned")
                self._accumulate(chunks[index], metrics)
            if self.parallel is not None:
                # every rank runs as many passes: the short ones add empty micro-batches
                empty = [replace(s, token_weight=0.0) for s in min(chunks, key=_chunk_tokens)]
                for _ in range(self.parallel.rounds(len(chunks)) - len(mine)):
                    self._accumulate(empty, metrics, counted=False)
                self._sum_over_ranks(metrics)
            self._optimizer_step(metrics)
        metrics.step = self.step_count
        metrics.seconds = time.perf_counter() - start
        metrics.tokens_per_second = metrics.total_tokens / max(metrics.seconds, 1e-9)
        return metrics

    def _accumulate(
        self, sequences: Sequence[TrainSequence], metrics: StepMetrics, *, counted: bool = True
    ) -> None:
        """Forward and backward over one micro-batch; its tokens carry the weights computed
        over the whole batch (`TrainSequence.token_weight`), so gradients add up to the
        batch's loss; its figures are token means over the batch (`metrics.tokens`). An
        uncounted one (a sharded rank's empty micro-batch) adds nothing to either."""
        batch = _collate(
            sequences, self.device, self.settings.pad_to_multiple, pack=self.settings.pack
        )
        logprobs, entropy = self._logprobs(self.model, batch, with_entropy=self.compute_entropy)
        ref_logprobs = self._reference_logprobs(batch)
        loss, part = grpo_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.mask,
            self.settings.clip_low,
            self.settings.clip_high,
            self.settings.kl_coef,
            ref_logprobs,
            token_weights=batch.token_weights,
        )
        if not counted:
            (loss * 0.0).backward()
            return
        loss.backward()
        weight = part.tokens / metrics.tokens
        metrics.loss += float(loss.item())
        metrics.policy_loss += part.policy_loss * weight
        metrics.clip_fraction += part.clip_fraction * weight
        metrics.ratio_mean += part.ratio_mean * weight
        metrics.kl += part.kl * weight
        metrics.entropy += entropy / metrics.tokens
        metrics.total_tokens += batch.real_tokens

    @torch.no_grad()
    def _reference_logprobs(self, batch: _Batch) -> torch.Tensor | None:
        """The KL reference's log-probs: the reference model's, or in LoRA mode the base
        model's (the adapter switched off); None without a KL term."""
        if self.reference is not None:
            return self._logprobs(self.reference, batch)[0]
        if self.lora and self.settings.kl_coef > 0:
            with self.model.disable_adapter():
                return self._logprobs(self.model, batch)[0]
        return None

    def _sum_over_ranks(self, metrics: StepMetrics) -> None:
        """Each rank ran its share of the micro-batches: sum the figures (the gradients were
        summed by the backward passes' reduce-scatters)."""
        assert self.parallel is not None
        names = ("loss", "policy_loss", "clip_fraction", "ratio_mean", "kl", "entropy")
        values = [getattr(metrics, name) for name in names] + [metrics.total_tokens]
        summed = self.parallel.sum_floats(values)
        for name, value in zip(names, summed, strict=False):
            setattr(metrics, name, value)
        metrics.total_tokens = round(summed[-1])

    def _optimizer_step(self, metrics: StepMetrics) -> None:
        """Clip the gradient norm and step; a non-finite gradient skips the update."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.settings.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        metrics.grad_norm = float(grad_norm.item())
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self.step_count += 1
            metrics.stepped = True
        else:
            metrics.nonfinite_grad = True
            log.warning("nonfinite_gradient_skipped", step=self.step_count)
        self.optimizer.zero_grad(set_to_none=True)

    def build_sequences(
        self, groups: Sequence[GradedGroup]
    ) -> tuple[list[TrainSequence], int, int]:
        """The trainable sequences of `groups`, the number of groups skipped (no reward
        variance) and the number of `env_error` completions left out."""
        sequences: list[TrainSequence] = []
        skipped = 0
        env_errors = 0
        for group in groups:
            rewards = [None if c.outcome == "env_error" else c.reward for c in group.completions]
            env_errors += sum(reward is None for reward in rewards)
            advantages = group_advantages(rewards, group.role, self.settings)
            if advantages is None:
                skipped += 1
                continue
            for completion, reward, advantage in zip(
                group.completions, rewards, advantages.tolist(), strict=True
            ):
                if reward is None or not completion.token_ids:
                    continue
                _check_completion(
                    group, completion.prompt_token_ids, completion.token_ids, completion.logprobs
                )
                sequences.append(
                    TrainSequence(
                        prompt=list(completion.prompt_token_ids),
                        completion=list(completion.token_ids),
                        old_logprobs=list(completion.logprobs),
                        advantage=advantage,
                        temperature=self.temperatures[group.role],
                        role=group.role,
                    )
                )
        weights = role_token_weights(
            [s.role for s in sequences], [len(s.completion) for s in sequences]
        )
        sequences = [replace(s, token_weight=w) for s, w in zip(sequences, weights, strict=True)]
        return sequences, skipped, env_errors

    def _logprobs(
        self, model: Any, batch: _Batch, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, float]:
        """Log-probs [B, keep - 1] of each kept column's target at the rows' temperatures
        (zero where the mask is false), and the summed entropy over the masked tokens
        (0.0 unless `with_entropy`). Under sharding through the model's `_Passes`, whose
        hooks gather the weights outside the decoder layers around the whole pass."""
        passes = self._passes.get(id(model))
        if passes is not None:
            result: tuple[torch.Tensor, float] = passes(batch, with_entropy)
            return result
        return self._logprobs_of(model, batch, with_entropy)

    def _logprobs_of(
        self, model: Any, batch: _Batch, with_entropy: bool
    ) -> tuple[torch.Tensor, float]:
        if not self.chunked_head:
            logits = self._logits(model, batch)
            total = _entropy_sum(logits.detach(), batch.mask) if with_entropy else 0.0
            return token_logprobs(logits, batch.targets), total
        with self._autocast():
            hidden = model.get_decoder()(
                input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
            ).last_hidden_state
        head = model.get_output_embeddings().weight
        # column j of the kept positions predicts input token first + j + 1; the last predicts none
        hidden = hidden[:, -batch.keep : -1][batch.mask].to(head.dtype)
        temperatures = batch.temperatures[batch.mask]
        logprobs, entropy = head_logprobs(
            hidden, head, batch.targets[batch.mask], temperatures, with_entropy=with_entropy
        )
        full = torch.zeros(batch.mask.shape, dtype=torch.float32, device=self.device)
        return full.masked_scatter(batch.mask, logprobs), float(entropy.sum().item())

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is not None:
            # No cache of cast weights: it would hold a low-precision copy of every layer until
            # the forward pass ends (0.67 GiB for the 0.5B model), and each is used once there
            # (gradient checkpointing casts again when it recomputes a layer).
            return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)
        return contextlib.nullcontext()

    def _logits(self, model: Any, batch: _Batch) -> torch.Tensor:
        """Logits at the positions that predict completion tokens, divided by the temperature
        (the whole head at once: for models whose logits are not just the head's output)."""
        with self._autocast():
            out = model(
                input_ids=batch.input_ids,
                position_ids=batch.position_ids,
                logits_to_keep=batch.keep,
                use_cache=False,
            )
        # column j of the kept logits predicts input token first + j + 1; the last predicts none
        return out.logits[:, :-1].float() / batch.temperatures[..., None]

    @torch.no_grad()
    def completion_logprobs(
        self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], role: Role = "solver"
    ) -> list[float]:
        """Log-probs of `token_ids` after `prompt_token_ids` under the current policy, at the
        role's training temperature (one process only: under sharding it would need every
        rank)."""
        if self.parallel is not None:
            raise UsageError("completion_logprobs runs in one process, not under sharding")
        seq = TrainSequence(
            list(prompt_token_ids),
            list(token_ids),
            [0.0] * len(token_ids),
            0.0,
            self.temperatures[role],
        )
        batch = _collate([seq], self.device, self.settings.pad_to_multiple)
        logprobs, _ = self._logprobs(self.model, batch)
        return logprobs[batch.mask].tolist()

    # ---------------------------------------------------------------------------- checkpoints

    def save_checkpoint(
        self, root: str | Path, extra: Mapping[str, Any] | None = None, *, keep: int = 3
    ) -> Path:
        """Write `root/step-NNNNNNNN/` atomically and keep the last `keep` checkpoints.

        The folder holds `model/` (save_pretrained, with the tokenizer), `optimizer.pt`,
        `rng.pt` and `state.json` (step, training mode and the caller's `extra`); it is written
        under a temporary name, fsynced, then renamed (`checkpoints.atomic_dir`), so a folder
        with a final name is always complete. In LoRA mode `adapter/` (peft's save_pretrained
        of the adapter, float32) replaces `model/`: the base weights are the model folder's.

        Under sharding `shards/` (every rank's part of the weights and AdamW's state,
        torch.distributed.checkpoint) replaces `model/` and `optimizer.pt`.

        `extra` is any JSON-serialisable dict (policy version, stream position, pool state);
        `load_checkpoint` gives it back."""
        root = Path(root)
        state = json.dumps(
            {
                "step": self.step_count,
                "extra": dict(extra or {}),
                "saved_at": time.time(),
                "ranks": self.parallel.world if self.parallel else 1,
                **mode_record(self.settings),
            }
        )
        target = root / f"{CHECKPOINT_PREFIX}{self.step_count:08d}"
        start = time.perf_counter()
        for stale in root.glob(f".tmp-{CHECKPOINT_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a writer killed mid-way
        needed = self.checkpoint_bytes()
        what = f"the step-{self.step_count} checkpoint"
        require_space(root, needed, what)
        with atomic_dir(target) as tmp, disk_full_as_error(root, what, needed):
            if self.parallel is not None:
                self.parallel.broadcast(("save", str(tmp)))
                self._save_shards(tmp)
            elif self.lora:
                save_adapter(self.model, tmp / ADAPTER_DIR)
            else:
                self.model.save_pretrained(tmp / "model")
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(tmp / "model")
            if self.parallel is None:
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(rng_state(), tmp / "rng.pt")
            (tmp / STATE_FILE).write_text(state)
        for old in list_checkpoints(root)[: -max(keep, 1)]:
            shutil.rmtree(old)
        log.info(
            "checkpoint_saved",
            path=str(target),
            step=self.step_count,
            seconds=round(time.perf_counter() - start, 3),
        )
        return target

    def checkpoint_bytes(self) -> int:
        """About what one checkpoint takes on disk: the weights, AdamW's two moments per
        trainable weight, and some room for the tokenizer. In LoRA mode: the adapter and its
        two moments, and a MiB for the configs, model card and RNG state."""
        if self.lora:
            return 3 * tensor_bytes(self.trainable) + 2**20
        # under sharding the ranks' shards add up to the whole (the same disk)
        trainable = (p for p in self.model.parameters() if p.requires_grad)
        weights = tensor_bytes(self.model.state_dict().values())
        return weights + 2 * tensor_bytes(trainable) + 2**25

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore weights (the adapter's in LoRA mode), optimiser state, step and RNG state
        from a checkpoint folder (or the latest one under a root); return the `extra` dict it
        was saved with. The learning rate and weight decay are then set from the current
        settings. A checkpoint of the other mode, or of another adapter shape, is refused with
        a `UsageError` that names the settings that resume it."""
        path = self._checkpoint_folder(path)
        if self.parallel is not None and self.parallel.leader:
            self.parallel.broadcast(("load", str(path)))
        return self._load_checkpoint(path)

    def _checkpoint_folder(self, path: str | Path) -> Path:
        """`path` itself if it is a checkpoint, else the latest one under it; checked to be of
        this trainer's mode (`lora.check_mode`)."""
        path = Path(path)
        if not (path / STATE_FILE).is_file():
            latest = latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(f"no checkpoint in {path}")
            path = latest
        check_mode(path.name, json.loads((path / STATE_FILE).read_text()), self.settings)
        if self.parallel is not None and not (path / SHARDS_DIR).is_dir():
            raise UsageError(
                f"checkpoint {path.name} was written by one process (model/, optimizer.pt) and "
                "a sharded learner resumes only sharded ones: resume it without torchrun, or "
                "export it (evoenv export) and start a new run from that folder"
            )
        return path

    def _load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        path = self._checkpoint_folder(path)
        state = json.loads((path / STATE_FILE).read_text())
        if (path / SHARDS_DIR).is_dir():
            self._load_shards(path / SHARDS_DIR)
        else:
            if self.lora:
                load_adapter(self.model, path / ADAPTER_DIR, self.device)
            else:
                _load_weights(self.model, path / "model", self.device)
            self.optimizer.load_state_dict(
                torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
            )
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.learning_rate
            group["weight_decay"] = self.settings.weight_decay
        set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        self.step_count = int(state["step"])
        log.info("checkpoint_loaded", path=str(path), step=self.step_count)
        return dict(state["extra"])

    def _save_shards(self, folder: Path) -> None:
        """Every rank: its shard of the weights and of AdamW's state into `folder/shards`
        (torch.distributed.checkpoint; rank 0 writes the index)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        weights, optimizer = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": weights, "optimizer": optimizer}, checkpoint_id=folder / SHARDS_DIR)

    def _load_shards(self, folder: Path) -> None:
        """The weights and AdamW's state from shards, resharded to this process's place (one
        process loads the whole)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        weights, optimizer = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": weights, "optimizer": optimizer}
        with warnings.catch_warnings():  # one process: "assuming ... a single process", right
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=folder)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def weights_for_push(self) -> torch.nn.Module | dict[str, torch.Tensor]:
        """What a weight push writes: the model itself in one process; under sharding its
        whole weights gathered on rank 0, on the CPU, tied ones once (a collective: rank 0
        sends the command to the other ranks)."""
        if self.parallel is None:
            return self.model
        self.parallel.broadcast(("gather",))
        return self._full_weights()

    def _full_weights(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full: dict[str, Any] = get_model_state_dict(self.model, options=options)
        return {name: tensor for name, tensor in full.items() if name not in self.tied}

    def export_hf(self, folder: str | Path, *, dtype: torch.dtype | None = None) -> Path:
        """The policy as a Hugging Face folder (config, safetensors, tokenizer), written
        atomically, in `dtype` (default: the dtype of the folder the model came from).

        In LoRA mode the adapter is merged into a fresh float32 copy of the base weights on
        the CPU (`lora.merged_model`; the training model keeps its adapter and trains on): a
        plain folder any Hugging Face or vLLM loader reads, no peft needed."""
        dtype = dtype or self.source_dtype
        if self.lora:
            merged = merged_model(self.model_path, self.model, self.settings)
            return self._save_hf(Path(folder), dtype, tokenizer=True, model=merged)
        return self._save_hf(Path(folder), dtype, tokenizer=True)

    def save_weights_for_push(
        self, folder: str | Path, *, dtype: torch.dtype | None = None
    ) -> Path:
        """Safetensors and config in save_pretrained's layout, which vLLM's `reload_weights`
        loads; written atomically, so a server never reads half a folder.

        Full fine-tuning only: in LoRA mode it raises `UsageError` (the weights that change are
        the adapter's: push them with `save_adapter_for_push`, or merged with `export_hf`)."""
        if self.lora:
            raise UsageError(
                "save_weights_for_push writes full weights, but this trainer trains a LoRA "
                f"adapter (EVOENV_GRPO__LORA_RANK={self.settings.lora_rank}): push it with "
                "save_adapter_for_push, or merged weights with export_hf"
            )
        return self._save_hf(Path(folder), dtype or self.source_dtype, tokenizer=False)

    def save_adapter_for_push(
        self, folder: str | Path, *, dtype: torch.dtype | None = None
    ) -> Path:
        """LoRA mode: the adapter in peft's save_pretrained layout (`adapter_config.json`,
        `adapter_model.safetensors` with keys `base_model.model.<module>.lora_A.weight`), which
        vLLM's LoRA loader (`--enable-lora`, a `max_lora_rank` of at least the rank) and
        `PeftModel.from_pretrained` read; tensors in `dtype` (the server's; default: the
        dtype of the model folder). Written atomically; returns `folder`."""
        if not self.lora:
            raise UsageError(
                "save_adapter_for_push needs a LoRA trainer (EVOENV_GRPO__LORA_RANK > 0); "
                "push full weights with save_weights_for_push"
            )
        return write_adapter(self.model, Path(folder), dtype or self.source_dtype)

    def adapter_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of the adapter's tensors in `dtype` (default: as trained); 0 without LoRA."""
        if not self.lora:
            return 0
        size = dtype.itemsize if dtype is not None else None
        return sum(p.numel() * (size or p.element_size()) for p in self.trainable)

    def _save_hf(
        self, folder: Path, dtype: torch.dtype, *, tokenizer: bool, model: Any = None
    ) -> Path:
        """`model` (default: the training model) with save_pretrained in `dtype`, atomically.
        Under sharding (rank 0) the gathered weights, in save_pretrained's layout (config,
        `model.safetensors`)."""
        from evoenv_learner.publisher import write_safetensors

        model = self.model if model is None else model
        weights = self.weights_for_push() if self.parallel is not None else None
        with atomic_dir(folder) as tmp:
            if isinstance(weights, dict):
                model.config.save_pretrained(tmp)
                write_safetensors(weights, tmp / "model.safetensors", dtype, {"format": "pt"})
            else:
                model.save_pretrained(tmp, state_dict=_cast_state_dict(model, dtype))
            config_file = tmp / "config.json"
            config = json.loads(config_file.read_text())
            config["dtype"] = str(dtype).removeprefix("torch.")
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            if tokenizer and self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp)
        return folder


class _Passes(torch.nn.Module):
    """A model's log-prob pass as one module's forward: under sharding the root FSDP2 wraps,
    so that its hooks gather the embeddings, final norm and head (which the chunked head reads
    outside the model's own forward) around the pass, and sum their gradients after it."""

    def __init__(self, model: torch.nn.Module, run: Any) -> None:
        super().__init__()
        self.model = model
        self.run = run

    def forward(self, batch: _Batch, with_entropy: bool) -> tuple[torch.Tensor, float]:
        result: tuple[torch.Tensor, float] = self.run(self.model, batch, with_entropy)
        return result


def _blocks(model: Any) -> list[torch.nn.Module]:
    """The model's decoder layers: each its own FSDP2 unit."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise UsageError(f"cannot shard {type(model).__name__}: its decoder has no `layers`")
    return list(layers)


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that repeat an earlier one (tied weights), by the first's storage."""
    seen: set[int] = set()
    tied: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied


def _chunk_tokens(chunk: Sequence[TrainSequence]) -> int:
    return sum(len(s.prompt) + len(s.completion) for s in chunk)


# ------------------------------------------------------------------------------- batching


@dataclass(frozen=True, slots=True)
class _Batch:
    input_ids: torch.Tensor
    """[B, T] prompt + completion, right-padded with 0 (the model is called without an
    attention mask: under causal attention no real token sees the padding after it); packed,
    [1, T]: the sequences one after the other."""
    position_ids: torch.Tensor | None
    """Packed: [1, T], each sequence's positions from 0 (transformers then keeps attention
    inside each sequence); None: 0 ... T - 1 on every row."""
    real_tokens: int
    """Prompt and completion tokens of the batch, the padding left out."""
    keep: int
    """Logit columns the model computes: the last `keep` positions."""
    targets: torch.Tensor
    """[B, keep - 1] the token each kept column predicts (0 where none)."""
    mask: torch.Tensor
    """[B, keep - 1] true where the target is a completion token."""
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    """[B, keep - 1], as the rest: each column its sequence's (a packed row holds several)."""
    temperatures: torch.Tensor
    token_weights: torch.Tensor
    """[B, keep - 1] what each completion token weighs in the loss."""


def _collate(
    sequences: Sequence[TrainSequence],
    device: torch.device,
    multiple: int = 1,
    *,
    pack: bool = False,
) -> _Batch:
    """A micro-batch as tensors, its length a multiple of `multiple` tokens, with the
    behaviour log-probs lined up with the logit columns: one row per sequence, right-padded,
    or with `pack` all of them in one row (no padding between them).

    Position p's logits predict token p + 1, so a completion starting at position P is
    predicted by columns P - 1 ... ; unpacked, only columns from the shortest prompt's end on
    are kept (no logits are computed over most of the prompts)."""
    lengths = [len(s.prompt) + len(s.completion) for s in sequences]
    if pack:
        total = sum(lengths)
        length = -(-total // multiple) * multiple
        starts = [sum(lengths[:i]) for i in range(len(sequences))]
        first, rows = 0, [(0, start) for start in starts]
        input_ids = torch.zeros(1, length, dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths] + [torch.arange(length - total)])[
            None
        ]
    else:
        length = -(-max(lengths) // multiple) * multiple
        first = min(len(s.prompt) for s in sequences) - 1
        rows = [(row, 0) for row in range(len(sequences))]
        input_ids = torch.zeros(len(sequences), length, dtype=torch.long)
        positions = None
    width = length - first - 1
    shape = (input_ids.shape[0], width)
    mask = torch.zeros(shape, dtype=torch.bool)
    old = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    temperatures = torch.ones(shape, dtype=torch.float32)
    weights = torch.zeros(shape, dtype=torch.float32)
    for seq, (row, offset) in zip(sequences, rows, strict=True):
        tokens = seq.prompt + seq.completion
        input_ids[row, offset : offset + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        begin = offset + len(seq.prompt) - 1 - first
        end = begin + len(seq.completion)
        mask[row, begin:end] = True
        old[row, begin:end] = torch.tensor(seq.old_logprobs, dtype=torch.float32)
        advantages[row, begin:end] = seq.advantage
        temperatures[row, begin:end] = seq.temperature
        weights[row, begin:end] = seq.token_weight
    return _Batch(
        input_ids=input_ids.to(device),
        position_ids=positions.to(device) if positions is not None else None,
        real_tokens=sum(lengths),
        keep=width + 1,
        targets=input_ids[:, first + 1 :].to(device),
        mask=mask.to(device),
        old_logprobs=old.to(device),
        advantages=advantages.to(device),
        temperatures=temperatures.to(device),
        token_weights=weights.to(device),
    )


@torch.no_grad()
def _head_is_plain(model: Any) -> bool:
    """True when the model's logits are its output embedding applied to its decoder's last
    hidden state (no bias, scale or soft-capping), checked on a few tokens: then the log-probs
    are computed a chunk of tokens at a time (`head_logprobs`) instead of all logits at once."""
    head = model.get_output_embeddings()
    decoder = model.get_decoder()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or decoder is None:
        return False
    ids = torch.arange(1, 9, device=head.weight.device)[None] % head.weight.shape[0]
    logits = model(input_ids=ids, use_cache=False).logits.float()
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
    plain = bool(torch.allclose(logits, (hidden @ head.weight.T).float(), rtol=1e-3, atol=1e-3))
    if not plain:
        log.info("lm_head_not_plain", note="log-probs from whole logits (more memory)")
    return plain


def _check_completion(
    group: GradedGroup, prompt: Sequence[int], tokens: Sequence[int], logprobs: Sequence[float]
) -> None:
    if not prompt:
        raise ValueError(f"group {group.group_id}: a completion has no prompt_token_ids")
    if len(logprobs) != len(tokens):
        raise ValueError(
            f"group {group.group_id}: {len(tokens)} completion tokens but {len(logprobs)} "
            "behaviour log-probs"
        )


def _entropy_sum(logits: torch.Tensor, mask: torch.Tensor) -> float:
    rows = logits[mask]
    return sum(
        float(token_entropy(rows[i : i + ENTROPY_CHUNK]).sum().item())
        for i in range(0, rows.shape[0], ENTROPY_CHUNK)
    )


def reward_stats(groups: Sequence[GradedGroup]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and (population) std of the valid rewards, by role."""
    by_role: dict[str, list[float]] = {}
    for group in groups:
        for completion in group.completions:
            if completion.reward is not None and completion.outcome != "env_error":
                by_role.setdefault(group.role, []).append(float(completion.reward))
    means: dict[str, float] = {}
    stds: dict[str, float] = {}
    for role, values in by_role.items():
        tensor = torch.tensor(values, dtype=torch.float64)
        means[role] = float(tensor.mean())
        stds[role] = float(tensor.std(correction=0))
    return means, stds


# ---------------------------------------------------------------------- weights and folders


def _cast_state_dict(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict with floating tensors in `dtype`, tied tensors still sharing storage
    (so save_pretrained still recognises and drops the tied copy)."""
    cast: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key not in cast:
            value = tensor.detach()
            cast[key] = value.to(dtype) if value.is_floating_point() else value
        out[name] = cast[key]
    return out


def _load_weights(model: torch.nn.Module, folder: Path, device: torch.device) -> None:
    """Copy the safetensors weights in `folder` into `model`; missing keys must be tied ones."""
    state: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    for file in files:
        state.update(load_file(str(file), device=str(device)))
    result = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded_ptrs = {own[name].data_ptr() for name in state if name in own}
    untied = [name for name in result.missing_keys if own[name].data_ptr() not in loaded_ptrs]
    if untied or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {untied[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


def _checkpointing(given: bool | None, settings: GrpoSettings) -> bool:
    """Gradient checkpointing: as given, else as set, else on in full fine-tuning and off with
    LoRA (`GrpoSettings.gradient_checkpointing`)."""
    if given is not None:
        return given
    if settings.gradient_checkpointing is not None:
        return settings.gradient_checkpointing
    return settings.lora_rank == 0


def _compute_dtype(settings: GrpoSettings, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of float32 master weights: the setting where given, else bfloat16 on
    a GPU or a CPU that computes it natively (`shared.hardware`), else none (float32)."""
    from shared.hardware import cpu_dtype, cpu_flags

    name = settings.compute_dtype or (
        "bfloat16" if device.type == "cuda" else cpu_dtype(cpu_flags())
    )
    return torch.bfloat16 if name == "bfloat16" else None


def _config_dtype(folder: Path) -> torch.dtype | None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None
