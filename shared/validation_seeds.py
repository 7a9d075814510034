"""The seeds L2-L5 sample a file's instances at (`validation_seeds`): derived from a secret of
the installation (`validation.secret`, else DATA_DIR/validation.key, written on first use) and
the file's SHA-256, so the same file gets the same seeds for one installation and no file can
know them: it cannot behave well only where it is checked (docs/CONTRACT.md#admission-stages).
"""

from __future__ import annotations

import hashlib
import hmac
import random

from shared.config import Settings
from shared.environment import TRAIN_SEEDS
from shared.errors import UsageError
from shared.secret_file import secret_in

KEY_FILE = "validation.key"
"""The secret's file in the data folder: one line of hex, readable by its owner only."""
MIN_SECRET = 16
"""Fewest characters of a secret: fewer could be guessed by trying them all."""


def validation_secret(settings: Settings) -> bytes:
    """The secret: `EVOENV_VALIDATION__SECRET` if set, else the data folder's file, written if
    missing (the first process to write it wins; the others read it)."""
    value = settings.validation.secret.get_secret_value()
    path = settings.data_dir / KEY_FILE
    try:
        text = value or secret_in(path)
    except OSError as exc:
        raise UsageError(
            f"the validation secret {path} cannot be read or written ({exc}): set "
            "EVOENV_VALIDATION__SECRET"
        ) from exc
    if len(text) < MIN_SECRET:
        where = "EVOENV_VALIDATION__SECRET" if value else str(path)
        raise UsageError(f"the validation secret ({where}) has fewer than {MIN_SECRET} characters")
    return text.encode()


def validation_seeds(secret: bytes, data: bytes, count: int) -> list[int]:
    """`count` distinct training seeds for the file whose bytes are `data`: the same for the
    same secret and file, unrelated across files and secrets."""
    file_hash = hashlib.sha256(data).digest()
    digest = hmac.new(secret, b"evoenv validation seeds:" + file_hash, hashlib.sha256).digest()
    return random.Random(int.from_bytes(digest, "big")).sample(TRAIN_SEEDS, count)
