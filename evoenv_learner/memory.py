"""The learner's resident memory: measured now (`rss_gib`) and at its highest since a mark
(`reset_peak`, `peak_rss_gib`: a step's true peak, which a reading after the step misses), and
handed back to the system between steps (`release_memory`; why:
docs/results.md#figures-behind-defaults).
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
