"""The dtype choice from the CPU's flags: bfloat16 only with native support, a setting wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.hardware import cpu_dtype, cpu_flags, cpu_model_name, describe, serving_dtype

AVX2_ONLY = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512_bf16"}
AMX = AVX2_ONLY | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_vnni"}


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        (AVX2_ONLY, "float32"),
        (AVX512_NO_BF16, "float32"),
        (AVX512_BF16, "bfloat16"),
        (AMX, "bfloat16"),
        (frozenset(), "float32"),
    ],
)
def test_bfloat16_only_where_the_cpu_computes_it_natively(
    flags: frozenset[str], dtype: str
) -> None:
    assert cpu_dtype(flags) == dtype
    assert serving_dtype(None, gpu=False, flags=flags) == dtype


def test_a_given_setting_wins_and_a_gpu_serves_bfloat16() -> None:
    assert serving_dtype("bfloat16", gpu=False, flags=AVX2_ONLY) == "bfloat16"
    assert serving_dtype("float32", gpu=False, flags=AMX) == "float32"
    assert serving_dtype(None, gpu=True, flags=AVX2_ONLY) == "bfloat16"
    assert describe("float32", gpu=False, flags=AVX2_ONLY, given=None) == (
        "dtype float32 (CPU with no native bfloat16 (no AMX, no AVX512-BF16))"
    )
    assert describe("float32", gpu=False, flags=AMX, given="float32") == "dtype float32 (set)"


def test_flags_and_model_name_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_model_name(cpuinfo) == "AMD EPYC"
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_model_name(tmp_path / "missing") == "unknown CPU"
