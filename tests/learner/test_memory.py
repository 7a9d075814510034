"""The learner hands freed memory back to the system between steps (glibc's malloc_trim), and
measures a step's peak resident size (the kernel's high-water mark, reset before the step)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from evoenv_learner.memory import GrowthTrace, peak_rss_gib, release_memory, reset_peak, rss_gib
from evoenv_learner.publisher import write_weights

FRAGMENTS = """
import json
import sys
import torch
from evoenv_learner.memory import keep_heap_small, release_memory, rss_gib
if "--small-heap" in sys.argv:
    assert keep_heap_small()
base = rss_gib()
big = torch.empty(24 * 2**20, dtype=torch.uint8)
del big  # freeing 24 MiB raises glibc's mmap threshold: the pieces below go to a heap
pieces = [torch.ones(4 * 2**20, dtype=torch.uint8) for _ in range(256)]  # 1 GiB, 4 MiB each
kept = pieces[1::2]
del pieces  # every other piece freed: 0.5 GiB of holes between the kept ones
held = rss_gib() - base - 0.5
release_memory()
print(json.dumps({"held": held, "released": rss_gib() - base - 0.5}))
"""
"""Prints the GiB resident beyond the pieces still in use: after the frees, after
`release_memory`."""


def fragments(*args: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTS, *args], capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout))


def test_release_memory_returns_freed_pieces_to_the_system() -> None:
    rss = fragments()
    if rss["held"] < 0.4:
        pytest.skip(f"this allocator returned the freed pieces by itself: {rss}")
    assert rss["released"] < 0.1, rss


def test_a_small_heap_gives_freed_pieces_back_at_once() -> None:
    assert fragments("--small-heap")["held"] < 0.1


def test_rss_is_this_process_resident_size() -> None:
    release_memory()
    before = rss_gib()
    block = bytearray(256 * 2**20)  # zero-filled: resident at once
    assert rss_gib() - before > 0.2
    del block


def test_peak_rss_sees_a_freed_buffer_that_rss_no_longer_does() -> None:
    reset_peak()
    block = bytearray(512 * 2**20)  # resident at once; over glibc's mmap threshold
    del block  # unmapped: the resident size falls back
    assert peak_rss_gib() - rss_gib() > 0.4


def test_reset_peak_starts_a_new_high_water_mark_at_the_resident_size() -> None:
    block = bytearray(512 * 2**20)
    del block
    assert reset_peak()
    assert peak_rss_gib() - rss_gib() < 0.1


def test_pushed_weights_read_back_as_safetensors_writes_them(
    model_dir: Path, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.model.norm.weight.data.normal_()  # not all ones: a mixed-up order would show
    folder = write_weights(model, tmp_path / "v1", torch.bfloat16)
    expected = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:  # the tied head once
            seen.add(tensor.data_ptr())
            expected[name] = tensor.to(torch.bfloat16)
    save_file(expected, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    written = load_file(str(folder / "model.safetensors"))
    reference = load_file(str(tmp_path / "reference.safetensors"))
    assert written.keys() == reference.keys() == expected.keys()
    for name, tensor in reference.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    with safe_open(str(folder / "model.safetensors"), "pt") as opened:
        assert opened.metadata() == {"format": "pt"}
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reloaded.load_state_dict({k: v.float() for k, v in written.items()}, strict=False)
    assert torch.equal(reloaded.lm_head.weight, expected["model.embed_tokens.weight"].float())


def test_pushed_weights_are_cast_one_tensor_at_a_time(tmp_path: Path) -> None:
    layers = [torch.nn.utils.skip_init(torch.nn.Linear, 4096, 8192, bias=False) for _ in range(4)]
    model = torch.nn.Sequential(*layers)  # 4 x 128 MiB in float32
    for layer in layers:
        layer.weight.data.fill_(1.0)
    release_memory()
    before = rss_gib()
    reset_peak()
    write_weights(model, tmp_path / "v1", torch.bfloat16)
    # one 64 MiB cast at a time, not the whole 256 MiB bfloat16 copy
    assert peak_rss_gib() - before < 0.15


_KEPT: list[bytes] = []


def _keep_growing() -> None:
    _KEPT.extend(bytes(64 * 1024) for _ in range(160))  # 10 MiB held across readings


def test_the_growth_trace_names_the_line_that_kept_memory_between_readings() -> None:
    trace = GrowthTrace()
    try:
        _keep_growing()
        (top, *_) = trace.growth()
        assert "test_memory.py" in top.split(" ")[0] and "+10." in top, top
        assert not any("+10." in line for line in trace.growth())  # nothing new since
    finally:
        tracemalloc.stop()
        _KEPT.clear()
