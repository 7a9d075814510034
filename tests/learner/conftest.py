"""Fixtures of the learner's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_policy import write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen2 with hidden size 32 and 128 tokens (tied embeddings), with a tokenizer."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))
