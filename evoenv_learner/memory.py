"""The learner's resident memory: measured, and handed back to the system between steps.

A step allocates and frees gigabytes in pieces (activations, gradients, the bfloat16 copy of
the weights written for each push). glibc keeps freed pieces under 32 MiB in its heaps, so
the resident size of a learner on the embedded model grew from 11 to 14.6 GiB over three
steps, beside a vLLM server on the same 24 GiB machine. `malloc_trim` returns those pages;
elsewhere (no glibc) `release_memory` only collects garbage.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Collect garbage, then give the heap's free pages back to the system (where glibc)."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def rss_gib() -> float:
    """This process's resident memory now, in GiB (0.0 where /proc is not available)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE / 2**30
    except (OSError, IndexError, ValueError):
        return 0.0
