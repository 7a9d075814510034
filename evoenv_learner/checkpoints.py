"""Checkpoint folders on disk: atomic writes, listing, and the RNG state they carry.

A checkpoint is a folder `step-00000012/` under a root (`model/` or, in LoRA mode, `adapter/`;
`optimizer.pt`, `rng.pt`, `state.json`), filled by `Trainer.save_checkpoint` in `atomic_dir`.
Writers check the free space first (`require_space`); a full disk mid-write is `DiskFull`, one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from shared.errors import DiskFull

CHECKPOINT_PREFIX = "step-"
STATE_FILE = "state.json"
FULL_BELOW = 64 * 2**20
"""A write error with less free space than this (bytes) left on the disk is a full disk."""


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if (
        state["cuda"]
        and torch.cuda.is_available()
        and len(state["cuda"]) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the tensors take (a storage shared by tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        # a shard (DTensor): its numel() is the whole tensor's
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.data_ptr() not in seen:
            seen.add(local.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def require_space(folder: Path, needed: int, what: str) -> None:
    """Raise `DiskFull` unless the disk holding `folder` has `needed` bytes (plus 5 %) free."""
    free = shutil.disk_usage(_existing(folder)).free
    if free < needed * 1.05:
        raise DiskFull(_no_space(folder, what, needed, free))


@contextlib.contextmanager
def disk_full_as_error(folder: Path, what: str, needed: int) -> Iterator[None]:
    """Turn a write that failed because the disk filled up into `DiskFull`. Libraries word it
    differently (OSError ENOSPC, safetensors' and torch.save's own errors), so any error
    counts when it says so or when the disk under `folder` is all but full right after it."""
    try:
        yield
    except Exception as exc:
        if not (
            getattr(exc, "errno", None) == errno.ENOSPC
            or "No space left" in str(exc)
            or shutil.disk_usage(_existing(folder)).free < FULL_BELOW
        ):
            raise
        raise DiskFull(_no_space(folder, what, needed, None)) from exc


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _no_space(folder: Path, what: str, needed: int, free: int | None) -> str:
    have = "the disk filled up while writing" if free is None else f"{_size(free)} free"
    return (
        f"not enough disk space for {what} in {folder}: needs about {_size(needed)}, {have}; "
        "free space (old runs, EVOENV_LEARNER__KEEP_CHECKPOINTS) and start again with --resume"
    )


def _size(count: float) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


def list_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        path
        for path in root.glob(f"{CHECKPOINT_PREFIX}*")
        if path.is_dir() and (path / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda path: int(path.name.removeprefix(CHECKPOINT_PREFIX)))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; when the block ends without error, fsync
    everything in it and rename it to `target` (replacing an older one). On error, remove it:
    `target` is never seen half-written."""
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".tmp-{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a writer killed mid-way
    tmp = parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if target.exists():
            old = parent / f".old-{target.name}-{uuid.uuid4().hex[:8]}"
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            tmp.rename(target)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
