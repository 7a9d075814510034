"""Which floating-point type this machine computes fast in: the dtype choice for a CPU
(`cpu_dtype`, `serving_dtype`). The flags are read once per process from /proc/cpuinfo.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""CPU flags (as /proc/cpuinfo names them) that mean native bfloat16 arithmetic."""

Dtype = Literal["bfloat16", "float32"]


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags; empty where /proc/cpuinfo is missing (not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name, e.g. "AMD EPYC"; "unknown CPU" where it is not given."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "unknown CPU"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown CPU"


def native_bf16(flags: frozenset[str]) -> bool:
    """Whether a CPU with these flags computes bfloat16 natively."""
    return bool(flags & NATIVE_BF16_FLAGS)


def cpu_dtype(flags: frozenset[str]) -> Dtype:
    """bfloat16 where the CPU computes it natively, float32 otherwise.

    A CPU runs bfloat16 fast only with native support (AMX or AVX512-BF16); without it vLLM's
    CPU build emulates it, several times slower than float32
    (docs/results.md#figures-behind-defaults). This is the serving and the training dtype on a
    CPU; a GPU serves bfloat16.
    """
    return "bfloat16" if native_bf16(flags) else "float32"


def serving_dtype(given: str | None, *, gpu: bool, flags: frozenset[str]) -> str:
    """The dtype a vLLM server runs in: the setting where one is given, else bfloat16 on a GPU
    and `cpu_dtype(flags)` on a CPU."""
    if given:
        return given
    return "bfloat16" if gpu else cpu_dtype(flags)


def describe(dtype: str, *, gpu: bool, flags: frozenset[str], given: str | None) -> str:
    """One line saying which dtype was chosen and why, for the commands that print it."""
    if given:
        return f"dtype {dtype} (set)"
    if gpu:
        return f"dtype {dtype} (GPU)"
    why = "native bfloat16" if native_bf16(flags) else "no native bfloat16 (no AMX, no AVX512-BF16)"
    return f"dtype {dtype} (CPU with {why})"
