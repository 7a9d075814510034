"""LoRA mode of the trainer (`EVOENV_GRPO__LORA_RANK` > 0): wrapping the policy with peft,
the adapter's files (checkpoints, pushes), merged exports, and which checkpoints a run may
resume. peft is imported only here, and only when LoRA is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from evoenv_learner.checkpoints import (
    atomic_dir,
    disk_full_as_error,
    require_space,
    tensor_bytes,
)
from shared.config import GrpoSettings
from shared.errors import UsageError

ADAPTER_DIR = "adapter"
"""The adapter's folder in a LoRA-mode checkpoint (where a full one has `model/`)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
INIT_SEED = 0
"""The adapter's A matrices are drawn from this seed (B starts at zero): every trainer, every
data-parallel rank, starts from the same adapter, and the global RNG is left untouched."""


def lora_config(settings: GrpoSettings) -> Any:
    """peft's `LoraConfig` for the settings (a causal LM, no bias terms trained)."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(settings.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def with_lora(model: Any, settings: GrpoSettings, device: torch.device) -> Any:
    """`model` wrapped in a peft LoRA model: the base weights frozen, only the adapter
    trainable. The adapter is initialised under `INIT_SEED` without disturbing the RNG."""
    from peft import get_peft_model

    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(INIT_SEED)
        return get_peft_model(model, lora_config(settings))


def mode_record(settings: GrpoSettings) -> dict[str, Any]:
    """What `state.json` records of the training mode: `{"mode": "full"}`, or `"lora"` with
    the adapter's shape (what a resuming run must match)."""
    if settings.lora_rank == 0:
        return {"mode": "full"}
    return {
        "mode": "lora",
        "lora": {
            "rank": settings.lora_rank,
            "alpha": settings.lora_alpha,
            "target_modules": sorted(settings.lora_target_modules),
            "dropout": settings.lora_dropout,
        },
    }


def settings_of(state: Mapping[str, Any], settings: GrpoSettings) -> GrpoSettings:
    """`settings` with the training mode and adapter shape a checkpoint's `state.json` records
    (what `evoenv export` builds its trainer with, whatever the environment says)."""
    if state.get("mode", "full") == "full":
        return settings.model_copy(update={"lora_rank": 0})
    saved = state["lora"]
    return settings.model_copy(
        update={
            "lora_rank": saved["rank"],
            "lora_alpha": saved["alpha"],
            "lora_target_modules": list(saved["target_modules"]),
        }
    )


def check_mode(name: str, state: Mapping[str, Any], settings: GrpoSettings) -> None:
    """Raise `UsageError` (one line: what to set) unless checkpoint `name`, whose `state.json`
    is `state`, was written in the mode and adapter shape of `settings`. A checkpoint without
    a mode field predates LoRA: full fine-tuning. The LoRA dropout may differ."""
    mode = state.get("mode", "full")
    if mode == "full":
        if settings.lora_rank > 0:
            raise UsageError(
                f"checkpoint {name} was written in full fine-tuning mode; resume it with "
                "EVOENV_GRPO__LORA_RANK=0, or start a new run folder"
            )
        return
    saved = state["lora"]
    wanted = mode_record(settings).get("lora", {})
    if all(saved[key] == wanted.get(key) for key in ("rank", "alpha", "target_modules")):
        return
    fixes = [f"EVOENV_GRPO__LORA_RANK={saved['rank']}"]
    if saved["alpha"] != settings.lora_alpha:
        fixes.append(f"EVOENV_GRPO__LORA_ALPHA={saved['alpha']}")
    if saved["target_modules"] != sorted(settings.lora_target_modules):
        fixes.append(f"EVOENV_GRPO__LORA_TARGET_MODULES='{json.dumps(saved['target_modules'])}'")
    raise UsageError(
        f"checkpoint {name} holds a LoRA adapter of rank {saved['rank']}, alpha "
        f"{saved['alpha']} on {','.join(saved['target_modules'])}; resume it with "
        f"{' '.join(fixes)}, or start a new run folder"
    )


def adapter_state(model: Any, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the peft model's own names (adapter name included, as
    peft's `save_pretrained(state_dict=...)` takes them), floating ones cast to `dtype`."""
    state = {
        name: tensor.detach() for name, tensor in model.state_dict().items() if "lora_" in name
    }
    if dtype is not None:
        state = {name: tensor.to(dtype) for name, tensor in state.items()}
    return state


def write_adapter(model: Any, folder: Path, dtype: torch.dtype | None = None) -> Path:
    """`save_adapter` for a server to load (a push): written atomically (a server never reads
    half a folder), after checking the disk has room, and readable by servers running as
    another user. Returns `folder`.

    On one torch thread: hundreds of small tensors cast one by one, each a parallel region
    that waits for its slowest thread, took 1.3-2.6 s beside a busy vLLM server on two cores
    against 0.1 s with the cores free (bench/bench_lora.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        needed = tensor_bytes(adapter_state(model, dtype).values()) + 2**20
        require_space(folder, needed, "the pushed adapter")
        with atomic_dir(folder) as tmp, disk_full_as_error(folder, "the pushed adapter", needed):
            save_adapter(model, tmp, dtype)
            tmp.chmod(0o755)
            for file in tmp.iterdir():
                file.chmod(0o644)
    finally:
        torch.set_num_threads(threads)
    return folder


def save_adapter(model: Any, folder: Path, dtype: torch.dtype | None = None) -> None:
    """peft's `save_pretrained` layout in `folder`: `adapter_config.json` as peft writes it
    (`base_model_name_or_path`, `r`, `lora_alpha`, `target_modules`, ...) and
    `adapter_model.safetensors` with peft's standard keys
    (`base_model.model.<module>.lora_A.weight`, no adapter name), which vLLM's LoRA loader
    and `PeftModel.from_pretrained` read; plus peft's model card (README.md). Embedding
    layers are never saved (none is trained), which also keeps peft from looking the base
    model up on the Hub."""
    model.save_pretrained(
        str(folder), state_dict=adapter_state(model, dtype), save_embedding_layers=False
    )


def load_adapter(model: Any, folder: Path, device: torch.device) -> None:
    """Copy the adapter saved in `folder` into `model`'s adapter; every adapter tensor must
    be there, and nothing else."""
    from peft import set_peft_model_state_dict

    file = folder / ADAPTER_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(f"no {ADAPTER_WEIGHTS} in {folder}")
    result: Any = set_peft_model_state_dict(model, load_file(str(file), device=str(device)))
    missing = [name for name in result.missing_keys if "lora_" in name]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"adapter {folder} does not match the model: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


def merged_model(model_path: Path, adapter_model: Any, settings: GrpoSettings) -> Any:
    """A plain Hugging Face model: the base freshly loaded from `model_path` (float32, on the
    CPU) with `adapter_model`'s adapter merged into its weights (`merge_and_unload`). The
    training model is not touched."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    wrapped = with_lora(base, settings, torch.device("cpu"))
    state = get_peft_model_state_dict(adapter_model, save_embedding_layers=False)
    set_peft_model_state_dict(wrapped, {name: t.float().cpu() for name, t in state.items()})
    return wrapped.merge_and_unload()
