"""Make the learner's new weights live on every vLLM server, then bump the policy version.

`WeightPublisher.publish(model) -> version`, by `make_publisher`'s choice: `ReloadPublisher`
(portable) or `NcclPublisher` (GPU, untested without one) for full weights, `AdapterPublisher`
(no pause) in LoRA mode. Push sequences and failure rules: docs/DESIGN.md#policy-versions."""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import redis
import structlog
import torch

from evoenv_learner.checkpoints import disk_full_as_error, require_space
from shared import pauses, policy
from shared.config import Settings
from shared.errors import EvoEnvError, ServiceUnavailable, UsageError
from shared.hardware import cpu_flags, serving_dtype
from shared.inference import bearer

log = structlog.get_logger(__name__)

T = TypeVar("T")
WEIGHTS_FILE = "model.safetensors"


class PushFailed(EvoEnvError):
    """New weights could not be made live on every server; the previous ones were put back."""


Weights = torch.nn.Module | Mapping[str, torch.Tensor]
"""What a push sends: the training module, or (from a sharded learner) its gathered weights."""


class WeightPublisher(Protocol):
    """Makes a model's current weights live on every server; returns the new policy version.

    Synchronous (torch and HTTP); the asyncio learner calls it through `asyncio.to_thread`.
    """

    pauses_servers: bool
    """Whether `publish` pauses the servers (full weights) or not (an adapter, loaded beside
    the others): a push that pauses nothing is made while a step still holds them."""

    def publish(self, model: Weights, version: int | None = None) -> int:
        """Push `model`'s weights as `version` (default: the version in Redis plus one)."""
        ...

    def hold(self) -> list[str]:
        """Pause every server in keep mode for a training step; the URLs paused."""
        ...

    def release(self, held: list[str]) -> None:
        """Resume the servers `hold` paused."""
        ...

    def close(self) -> None: ...


class _RetryableStep(Exception):
    pass


class ServerControl:
    """The development endpoints of one vLLM server (`VLLM_SERVER_DEV_MODE=1`), each call
    status-checked and retried on connection errors and 5xx answers."""

    def __init__(
        self, url: str, http: httpx.Client, *, attempts: int = 3, backoff: float = 1.0
    ) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.attempts = attempts
        self.backoff = backoff
        self.labels = True
        """False once the server turned out to have no /update_weight_version."""

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.post(f"{self.url}{path}", **kwargs)
        if response.status_code >= 500:
            raise _RetryableStep(f"{path} answered {response.status_code}: {response.text[:300]}")
        return response

    def _retry(self, what: str, step: Callable[[], T], attempts: int | None = None) -> T:
        attempts = attempts or self.attempts
        failures = []
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return step()
            except (httpx.TransportError, _RetryableStep) as exc:
                failures.append(str(exc) or type(exc).__name__)
                log.warning("push_step_retry", server=self.url, step=what, error=failures[-1])
        raise ServiceUnavailable(
            f"{self.url}: {what} failed {attempts} times: {'; '.join(failures)}"
        )

    def _ok(self, response: httpx.Response, what: str) -> None:
        if response.status_code != 200:
            raise ServiceUnavailable(
                f"{self.url}: {what} answered {response.status_code}: {response.text[:300]} "
                "(is the server running with VLLM_SERVER_DEV_MODE=1?)"
            )

    def pause(self, mode: str = "wait") -> None:
        self._ok(self._retry("pause", lambda: self._post("/pause", params={"mode": mode})), "pause")

    def resume(self) -> None:
        self._ok(self._retry("resume", lambda: self._post("/resume")), "resume")

    def reload(self, folder: Path, attempts: int | None = None) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        response = self._retry("reload", lambda: self._post("/collective_rpc", json=body), attempts)
        self._ok(response, "reload_weights")

    def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop the cached KV blocks; with `running`, also those of the requests in flight
        (frozen by a keep-mode pause), which are then recomputed under the new weights."""
        params = {"reset_running_requests": "true"} if running else {}

        def step() -> httpx.Response:
            response = self._post("/reset_prefix_cache", params=params)
            if response.status_code == 200 and response.json().get("success") is False:
                raise _RetryableStep("prefix cache still in use")
            return response

        self._ok(self._retry("reset_prefix_cache", step), "reset_prefix_cache")

    def label(self, version: int) -> None:
        """Label the served weights with `version` (reported per token by the token route)."""
        if not self.labels:
            return
        body = {"new_version": str(version)}
        response = self._retry("label", lambda: self._post("/update_weight_version", json=body))
        if response.status_code == 404:
            self.labels = False
            log.info("weight_version_labels_unsupported", server=self.url)
            return
        self._ok(response, "update_weight_version")

    def load_adapter(self, name: str, folder: Path) -> None:
        """Load the LoRA adapter in `folder` as `name` (requests asking for `name` use it),
        in place of any adapter of that name (a retried call; one a learner before this one
        left under the same version, after Redis lost the version)."""
        body = {"lora_name": name, "lora_path": str(folder), "load_inplace": True}
        response = self._retry(
            "load_lora_adapter", lambda: self._post("/v1/load_lora_adapter", json=body)
        )
        self._ok(response, "load_lora_adapter")

    def unload_adapter(self, name: str) -> None:
        """Unload adapter `name`; one the server does not have (404: restarted since) is done."""
        body = {"lora_name": name}
        response = self._retry(
            "unload_lora_adapter", lambda: self._post("/v1/unload_lora_adapter", json=body)
        )
        if response.status_code != 404:
            self._ok(response, "unload_lora_adapter")

    def adapters(self) -> list[str]:
        """The names of the LoRA adapters the server has loaded (`GET /v1/models`)."""
        response = self._retry("models", lambda: self.http.get(f"{self.url}/v1/models"))
        self._ok(response, "models")
        return [m["id"] for m in response.json().get("data", []) if m.get("parent")]

    def world_size(self) -> int:
        response = self._retry("world_size", lambda: self.http.get(f"{self.url}/get_world_size"))
        self._ok(response, "get_world_size")
        return int(response.json()["world_size"])


def write_weights(model: Weights, folder: Path, dtype: torch.dtype) -> Path:
    """Save `model`'s weights (a module, or its weights by name) as one safetensors file in
    `folder` (tied weights once), floating ones in `dtype`, one tensor cast at a time
    (`write_safetensors`)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    for name, tensor in state.items():
        key = tensor.data_ptr()
        if key in seen:
            continue  # a tied weight (e.g. lm_head sharing the embeddings): keep the first name
        seen.add(key)
        tensors[name] = tensor.detach()
    needed = sum(
        t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
        for t in tensors.values()
    )
    what = "the pushed weights"
    require_space(folder, needed, what)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{WEIGHTS_FILE}.tmp"
    try:
        with disk_full_as_error(folder, what, needed):
            write_safetensors(tensors, tmp, dtype, metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    tmp.rename(folder / WEIGHTS_FILE)
    folder.chmod(0o755)
    (folder / WEIGHTS_FILE).chmod(0o644)
    return folder


_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    tensors: Mapping[str, torch.Tensor],
    path: Path,
    dtype: torch.dtype,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` (on the CPU) as a safetensors file, floating ones in `dtype`, casting and
    writing one tensor at a time.

    `safetensors.torch.save_file` needs every tensor in its final dtype first: a whole cast
    copy of the weights beside the float32 ones (0.92 GiB in bfloat16 for the 0.5B model, at
    the learner's peak right after a step; docs/results.md#learner-memory). Here the extra
    memory is the largest tensor's cast (the embeddings: 0.27 GiB)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        out = dtype if tensor.is_floating_point() else tensor.dtype
        size = tensor.numel() * out.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[out],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for tensor in tensors.values():
            value = tensor.to(dtype) if tensor.is_floating_point() else tensor
            flat = value.contiguous().reshape(-1)
            if flat.numel():
                file.write(flat.view(torch.uint8).numpy().data)
            del value, flat


class _Pusher:
    """What both mechanisms share: the servers, Redis, and the pause/label/bump/resume frame."""

    pauses_servers = True

    def __init__(
        self,
        urls: Sequence[str],
        redis_client: redis.Redis,
        *,
        attempts: int = 3,
        backoff: float = 1.0,
        request_timeout: float = 600.0,
        pause_mode: str = "wait",
        api_key: str = "",
    ) -> None:
        if not urls:
            raise ValueError("no vLLM server URLs to publish to")
        self.redis = redis_client
        self.pause_mode = pause_mode
        self.http = httpx.Client(
            timeout=httpx.Timeout(request_timeout, connect=5.0), headers=bearer(api_key)
        )
        self.servers = [
            ServerControl(url, self.http, attempts=attempts, backoff=backoff) for url in urls
        ]
        self.version = policy.read_version(redis_client)
        """The version every server serves now (as far as this publisher knows)."""

    def close(self) -> None:
        self.http.close()

    def next_version(self, version: int | None) -> int:
        current = max(self.version, policy.read_version(self.redis))
        new = current + 1 if version is None else version
        if new <= current:
            raise policy.VersionNotIncreased(f"version {new} is not above {current}")
        return new

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Pause every server for the block; resume every one that was paused, whatever happens."""
        paused: list[ServerControl] = []
        pauses.began(self.redis)
        try:
            for server in self.servers:
                server.pause(self.pause_mode)
                paused.append(server)
            yield
        finally:
            failures = []
            for server in paused:
                try:
                    server.resume()
                except EvoEnvError as exc:
                    failures.append(str(exc))
                    log.error("resume_failed", server=server.url, error=str(exc))
            pauses.ended(self.redis)
            if failures:
                raise ServiceUnavailable("could not resume: " + "; ".join(failures))

    def hold(self) -> list[str]:
        """Pause every server in keep mode (in-flight requests freeze where they are, new ones
        queue) so that a training step has the cores; returns the URLs of those paused, for
        `release`. A server that cannot be paused is logged and left generating: the step
        only runs slower."""
        held = []
        pauses.began(self.redis)
        for server in self.servers:
            try:
                server.pause("keep")
            except EvoEnvError as exc:
                log.warning("hold_failed", server=server.url, error=str(exc))
                continue
            held.append(server.url)
        if not held:
            pauses.ended(self.redis)
        return held

    def release(self, held: list[str]) -> None:
        """Resume the servers `hold` paused; a failure is logged (the supervisor restarts a
        server that stops answering)."""
        for server in self.servers:
            if server.url in held:
                try:
                    server.resume()
                except EvoEnvError as exc:
                    log.error("resume_failed", server=server.url, error=str(exc))
        if held:
            pauses.ended(self.redis)

    def published(self, version: int, start: float, written: float) -> None:
        """Log a push made from a folder: the seconds to write it and to make it live."""
        log.info(
            "weights_published",
            version=version,
            servers=len(self.servers),
            write_seconds=round(written - start, 3),
            push_seconds=round(time.monotonic() - written, 3),
        )

    def commit(self, version: int) -> None:
        """Label every server with `version`, then publish it in Redis."""
        for server in self.servers:
            server.label(version)
        policy.publish_version(self.redis, version)
        self.version = version


class ReloadPublisher(_Pusher):
    """Portable mechanism (CPU and GPU): safetensors in a folder every server can read, then
    `POST /collective_rpc` `reload_weights` on each server.

    `push_dir` holds one folder per version (the last `keep` are kept); `current` is the
    folder the servers serve now (the prepared model at first), put back if a push fails on
    every server the push touched: a half-done reload leaves a vLLM CPU server unable to run
    its model.
    """

    def __init__(
        self,
        urls: Sequence[str],
        redis_client: redis.Redis,
        push_dir: Path,
        current: Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        keep: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(urls, redis_client, **kwargs)
        self.push_dir = push_dir
        self.current = current
        self.dtype = dtype
        self.keep = max(keep, 1)
        push_dir.mkdir(parents=True, exist_ok=True)

    def publish(self, model: Weights, version: int | None = None) -> int:
        new = self.next_version(version)
        start = time.monotonic()
        folder = write_weights(model, self.push_dir / f"v{new:08d}", self.dtype)
        written = time.monotonic()
        self.push_folder(folder, new)
        self.published(new, start, written)
        self._prune()
        return new

    def push_folder(self, folder: Path, version: int) -> None:
        """Make the weights in `folder` live as `version` on every server (or raise PushFailed)."""
        if not (folder / WEIGHTS_FILE).is_file() and not any(folder.glob("*.safetensors")):
            raise PushFailed(f"{folder} holds no safetensors weights")
        touched: list[ServerControl] = []
        try:
            with self.paused():
                try:
                    for server in self.servers:
                        touched.append(server)
                        server.reload(folder)
                        server.reset_prefix_cache(running=self.pause_mode == "keep")
                    self.commit(version)
                except Exception as exc:
                    self._roll_back(touched, exc)
                    raise
        except EvoEnvError as exc:
            raise PushFailed(
                f"push of version {version} failed; the policy version is {self.version} "
                f"(weights {self.current if self.version != version else folder}): {exc}"
            ) from exc
        self.current = folder

    def _roll_back(self, touched: list[ServerControl], cause: Exception) -> None:
        log.error("push_failed", error=str(cause), rolling_back=[s.url for s in touched])
        for server in touched:
            try:
                # A failed reload can leave the model half loaded (unable to generate), and
                # the server may have dropped the connection: try harder to put it back.
                server.reload(self.current, attempts=max(server.attempts, 3))
                server.reset_prefix_cache()
                server.label(self.version)
            except EvoEnvError as exc:
                log.critical(
                    "roll_back_failed",
                    server=server.url,
                    error=str(exc),
                    hint="this server may not be able to generate: restart it",
                )

    def _prune(self) -> None:
        folders = sorted(p for p in self.push_dir.glob("v*") if p.is_dir())
        for old in folders[: -self.keep]:
            if old != self.current:
                shutil.rmtree(old, ignore_errors=True)


class AdapterPublisher(_Pusher):
    """LoRA mode: each version's adapter is written to `push_dir/v{N}` and loaded into every
    server under `policy-v{N}` beside the older ones, with no pause: requests in flight finish
    on the adapter they asked for and new ones ask for the newest (`shared.inference`). Only
    then is the version published in Redis. Adapters more than `max_staleness` versions old are
    unloaded (a request still asking for one is retried on the newest); the servers hold
    `max_staleness + 1` of them (`evoenv_model.serve.lora_args`). A folder goes only
    `max_staleness + 1` versions after its adapter was unloaded from every server: a server
    reads an adapter's files again whenever it brings it back into its cache, a request
    accepted just before the unload included, and an adapter whose files are gone takes the
    whole server down (vLLM 0.32).

    A load that fails on a server unloads the new adapter from the servers that took it and
    raises `PushFailed`, the version unchanged. A restarted server has no adapter: the
    learner's republish (a new version) loads the current one into every server.

    The learner pushes an adapter before it releases the servers a step held
    (`learner.take_turns`): a CPU server loads an adapter between two of its engine steps, and
    those right after a release are long (a push just after it took 2 to 21 s with 8 adapter
    completions in flight, 29 to 33 s under `evoenv up`; made while held, 0.15 s).
    """

    pauses_servers = False

    def __init__(
        self,
        urls: Sequence[str],
        redis_client: redis.Redis,
        push_dir: Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        max_staleness: int = 4,
        **kwargs: Any,
    ) -> None:
        super().__init__(urls, redis_client, **kwargs)
        self.push_dir = push_dir
        self.dtype = dtype
        self.max_staleness = max_staleness
        push_dir.mkdir(parents=True, exist_ok=True)
        self.live: dict[str, set[int]] = {
            server.url: set(policy.adapter_versions(server.adapters())) for server in self.servers
        }
        """The adapter versions each server holds, as far as this publisher knows (those a
        previous learner left are found at start, and retired like the others)."""

    def publish(self, model: Weights, version: int | None = None) -> int:
        from evoenv_learner.lora import write_adapter

        assert isinstance(model, torch.nn.Module), "an adapter push sends the LoRA module"
        new = self.next_version(version)
        start = time.monotonic()
        folder = write_adapter(model, self.push_dir / f"v{new:08d}", self.dtype)
        written = time.monotonic()
        loaded: list[ServerControl] = []
        try:
            for server in self.servers:
                server.load_adapter(policy.adapter_name(new), folder)
                loaded.append(server)
                self.live[server.url].add(new)
            policy.publish_version(self.redis, new)
        except Exception as exc:
            log.error("push_failed", version=new, error=str(exc))
            for server in loaded:
                self._unload(server, new)
            shutil.rmtree(folder, ignore_errors=True)
            raise PushFailed(
                f"adapter push of version {new} failed; the policy version is {self.version}: {exc}"
            ) from exc
        self.version = new
        self.published(new, start, written)
        self._retire(new)
        return new

    def _unload(self, server: ServerControl, version: int) -> None:
        try:
            server.unload_adapter(policy.adapter_name(version))
        except EvoEnvError as exc:
            log.warning("adapter_unload_failed", server=server.url, version=version, error=str(exc))
            return
        self.live[server.url].discard(version)

    def _retire(self, newest: int) -> None:
        """Unload the adapters older than `max_staleness` versions; remove the folders of
        those `max_staleness + 1` versions older still that no server holds any more."""
        oldest_live = newest - self.max_staleness
        for server in self.servers:
            for version in sorted(v for v in self.live[server.url] if v < oldest_live):
                self._unload(server, version)
        held = set().union(*self.live.values())
        for folder in self.push_dir.glob("v*"):
            number = folder.name[1:]
            if not number.isdigit() or int(number) in held:
                continue
            if int(number) < oldest_live - self.max_staleness - 1:
                shutil.rmtree(folder, ignore_errors=True)


class NcclPublisher(_Pusher):
    """GPU fast path: NCCL broadcast through vLLM 0.32's weight-transfer API.

    Servers are started with `--weight-transfer-config '{"backend":"nccl"}'` (that is,
    `EVOENV_SERVE__WEIGHT_PUSH=nccl`); written against vLLM 0.32's
    `vllm.distributed.weight_transfer.nccl_engine`. UNTESTED without a GPU.

    Each server gets its own NCCL group (trainer rank 0, the server's workers after it) on
    `master_port + index`, opened once at construction; `model` is the training module whose
    parameters are streamed at each push (the same module object every time). A failed
    broadcast leaves that server's group unusable: the push raises `PushFailed` with every
    server resumed and the version unchanged, and the caller should fall back to a
    `ReloadPublisher` from its last checkpoint.
    """

    def __init__(
        self,
        urls: Sequence[str],
        redis_client: redis.Redis,
        model: torch.nn.Module,
        *,
        master_address: str,
        master_port: int,
        packed: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(urls, redis_client, **kwargs)
        if not torch.cuda.is_available():
            raise EvoEnvError("NcclPublisher needs a GPU; use ReloadPublisher on the CPU")
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        self.model = model
        self.engines = []
        for index, server in enumerate(self.servers):
            info = NCCLTrainerInitInfo(
                master_address=master_address,
                master_port=master_port + index,
                world_size=1 + server.world_size(),
                packed=packed,
                rank=0,
            )
            self.engines.append(
                NCCLTrainerWeightTransferEngine.trainer_init(
                    info,
                    client=HTTPVLLMWeightSyncClient(server.url, timeout=600),
                    source=ModuleSource(model),
                )
            )
        log.info("nccl_publisher_ready", servers=len(self.servers), master=master_address)

    def publish(self, model: Weights, version: int | None = None) -> int:
        if model is not self.model:
            raise ValueError("NcclPublisher streams the module it was built with")
        new = self.next_version(version)
        start = time.monotonic()
        try:
            with self.paused():
                for server, engine in zip(self.servers, self.engines, strict=True):
                    engine.send_weights()
                    server.reset_prefix_cache(running=self.pause_mode == "keep")
                self.commit(new)
        except Exception as exc:
            log.error("push_failed", version=new, error=str(exc))
            raise PushFailed(
                f"NCCL push of version {new} failed; the policy version is {self.version} and "
                f"the servers are resumed but may hold partial weights: push a checkpoint with "
                f"ReloadPublisher ({exc})"
            ) from exc
        log.info("weights_published", version=new, seconds=round(time.monotonic() - start, 3))
        return new

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        super().close()


def push_dtype(settings: Settings) -> torch.dtype:
    """The dtype pushed weights are written in: the servers' (`shared.hardware.serving_dtype`;
    `auto` serves the prepared model's own, bfloat16)."""
    name = serving_dtype(settings.serve.dtype, gpu=torch.cuda.is_available(), flags=cpu_flags())
    return torch.bfloat16 if name == "auto" else getattr(torch, name)


def make_publisher(
    settings: Settings,
    redis_client: redis.Redis,
    model: torch.nn.Module,
    push_dir: Path,
    current: Path,
    *,
    master_address: str = "127.0.0.1",
    master_port: int = 29600,
    sharded: bool = False,
) -> WeightPublisher:
    """The mechanism for `settings.vllm_urls`: in LoRA mode adapters loaded from folders under
    `push_dir`; otherwise the one `settings.serve.weight_push` selects, NCCL streaming `model`,
    or reload from folders under `push_dir` (`current`: the folder the servers serve now, put
    back if a push fails). Every request carries `serve.api_key` as a bearer token."""
    api_key = settings.serve.api_key.get_secret_value()
    if settings.grpo.lora_rank > 0:
        return AdapterPublisher(
            settings.vllm_urls,
            redis_client,
            push_dir,
            dtype=push_dtype(settings),
            max_staleness=settings.learner.max_staleness,
            api_key=api_key,
        )
    if settings.serve.weight_push == "nccl":
        if sharded:
            raise UsageError(
                "EVOENV_SERVE__WEIGHT_PUSH=nccl streams one process's module, and this learner "
                "is sharded across ranks: use the default push (reload from files)"
            )
        return NcclPublisher(
            settings.vllm_urls,
            redis_client,
            model,
            master_address=master_address,
            master_port=master_port,
            pause_mode=settings.serve.push_pause,
            api_key=api_key,
        )
    return ReloadPublisher(
        settings.vllm_urls,
        redis_client,
        push_dir,
        current,
        dtype=push_dtype(settings),
        pause_mode=settings.serve.push_pause,
        api_key=api_key,
    )
