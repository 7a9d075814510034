"""The learner hands freed memory back to the system between steps (glibc's malloc_trim)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evoenv_learner.memory import release_memory, rss_gib

FRAGMENTS = """
import json
import torch
from evoenv_learner.memory import release_memory, rss_gib
base = rss_gib()
big = torch.empty(24 * 2**20, dtype=torch.uint8)
del big  # freeing 24 MiB raises glibc's mmap threshold: the pieces below go to the heap
pieces = [torch.ones(4 * 2**20, dtype=torch.uint8) for _ in range(256)]  # 1 GiB, 4 MiB each
small = torch.ones(1000)
del pieces  # freed into the heap, still resident
held = rss_gib()
release_memory()
print(json.dumps({"base": base, "held": held, "released": rss_gib()}))
"""


def test_release_memory_returns_freed_pieces_to_the_system() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTS], capture_output=True, text=True, check=True
    )
    rss = json.loads(done.stdout)
    if rss["held"] - rss["base"] < 0.8:
        pytest.skip(f"this allocator returned the freed GiB by itself: {rss}")
    assert rss["released"] - rss["base"] < 0.2, rss


def test_rss_is_this_process_resident_size() -> None:
    release_memory()
    before = rss_gib()
    block = bytearray(256 * 2**20)  # zero-filled: resident at once
    assert rss_gib() - before > 0.2
    del block
