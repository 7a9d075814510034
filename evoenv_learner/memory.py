"""The learner's resident memory: measured now (`rss_gib`) and at its highest since a mark
(`reset_peak`, `peak_rss_gib`: a step's true peak, which a reading after the step misses);
freed memory given back to the system at once (`keep_heap_small`) and between steps
(`release_memory`; why: docs/results.md#learner-memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import tracemalloc

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _libc_function(function: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_TRIM = _libc_function("malloc_trim")
_MALLOPT = _libc_function("mallopt")
HEAP_SETTINGS = {"M_ARENA_MAX": 2, "M_MMAP_THRESHOLD": 2**20, "M_TRIM_THRESHOLD": 4 * 2**20}
"""glibc's allocator settings for the learner (`keep_heap_small`); as environment variables:
MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=4194304."""
_MALLOPT_PARAMS = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3, "M_ARENA_MAX": -8}


def keep_heap_small() -> bool:
    """Make glibc give freed memory back to the system at once instead of keeping it for later
    (False where there is no glibc `mallopt`; call it before the model is loaded).

    By default glibc serves any allocation below its mmap threshold from its heaps and keeps
    what is freed there; the threshold follows the largest block freed so far, up to 32 MiB,
    so after the first large tensor nearly every activation and gradient of a step lands in a
    heap, and freed pieces that do not fit the next request pile up, in one heap per thread
    that allocates (up to eight per core). A step on a generator group of the 0.5B model then
    peaked 2 GiB above what it held alive (docs/results.md#learner-memory). Here allocations
    of 1 MiB and more get their own mapping, returned when freed; the heaps shrink once 4 MiB
    at their top are free; and two heaps are shared by all threads (`HEAP_SETTINGS`)."""
    if _MALLOPT is None:
        return False
    return all(_MALLOPT(_MALLOPT_PARAMS[name], value) == 1 for name, value in HEAP_SETTINGS.items())


def release_memory() -> None:
    """Collect garbage, then give the heap's free pages back to the system (where glibc).

    A step allocates and frees gigabytes in pieces (activations, gradients, the bfloat16 copy
    of the weights written for each push), and glibc keeps freed pieces under 32 MiB in its
    heaps, so the resident size grows step by step. `malloc_trim` returns those pages;
    elsewhere (no glibc) this only collects garbage.
    """
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


def peak_rss_gib() -> float:
    """This process's highest resident memory since it started or since the last `reset_peak`,
    in GiB (the kernel's high-water mark, VmHWM; 0.0 where /proc is not available)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except (OSError, IndexError, ValueError):
        pass
    return 0.0


def reset_peak() -> bool:
    """Start a new high-water mark at the current resident size (Linux: "5" written to
    /proc/self/clear_refs); False where that is not possible (then `peak_rss_gib` keeps the
    process's peak since its start)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


class GrowthTrace:
    """Where this process's Python allocations grew since the last reading (`tracemalloc`, its
    cost paid only where `learner.trace_memory_every` turns it on): a diagnosis of a resident
    size that grows step after step. Tensors' storage is not Python's and is not seen."""

    def __init__(self, frames: int = 3) -> None:
        tracemalloc.start(frames)
        self._last = tracemalloc.take_snapshot()

    def growth(self, top: int = 8) -> list[str]:
        """The `top` places, innermost frame first, whose live allocations grew most since the
        last reading: "file:line < file:line ... +X MiB (+N blocks)"."""
        now = tracemalloc.take_snapshot()
        stats = now.compare_to(self._last, "traceback")
        self._last = now
        lines = []
        for stat in sorted(stats, key=lambda s: s.size_diff, reverse=True)[:top]:
            where = " < ".join(f"{f.filename}:{f.lineno}" for f in stat.traceback)
            lines.append(f"{where} {stat.size_diff / 2**20:+.1f} MiB ({stat.count_diff:+d} blocks)")
        return lines
