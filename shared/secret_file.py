"""A secret kept in a file of the data folder (the stream key, the validation secret, `up`'s
Redis password): written once, readable by its owner only, and the same for every process."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def secret_in(path: Path) -> str:
    """The secret in `path`, a new random one written there first if the file is missing. The
    file appears whole or not at all, and the first process to write it wins: one that loses
    the race reads the winner's. Raises `OSError` where it can be neither read nor written."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text().strip()
