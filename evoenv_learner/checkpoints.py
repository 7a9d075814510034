"""Checkpoint folders on disk: atomic writes, listing, and the RNG state they carry.

A checkpoint is a folder `step-00000012/` under a root; `Trainer.save_checkpoint` fills it
(`model/`, `optimizer.pt`, `rng.pt`, `state.json`) inside `atomic_dir`, which writes under a
temporary name, fsyncs, then renames: a folder with a final name is always complete.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_PREFIX = "step-"
STATE_FILE = "state.json"


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
