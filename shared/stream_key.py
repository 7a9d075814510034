"""The key that signs rollout stream entries: `Settings.stream_key`, else DATA_DIR/stream.key.

It never goes to Redis. On one machine the first process that needs it writes the file, so
every process there shares it (`evoenv up` also passes it to its children); another host is
given it (docs/deploy.md#the-stream-key).
"""

from __future__ import annotations

import hashlib
import hmac

from shared.config import MIN_STREAM_KEY, Settings
from shared.errors import UsageError
from shared.secret_file import secret_in

KEY_FILE = "stream.key"
"""The key's file in the data folder: one line of hex, readable by its owner only."""


def stream_key(settings: Settings) -> bytes:
    """The key: `EVOENV_STREAM_KEY` if set, else the data folder's file, written if missing."""
    value = settings.stream_key.get_secret_value()
    if value:
        return value.encode()
    path = settings.data_dir / KEY_FILE
    try:
        text = secret_in(path)
    except OSError as exc:
        raise UsageError(
            f"the stream key {path} cannot be read or written ({exc}): set EVOENV_STREAM_KEY"
        ) from exc
    if len(text) < MIN_STREAM_KEY:
        raise UsageError(
            f"the stream key {path} has fewer than {MIN_STREAM_KEY} characters: delete it (a new "
            "one is written) or put the workers' and learner's key there"
        )
    return text.encode()


def key_id(key: bytes) -> str:
    """A short name of `key` for log lines: tells two keys apart, tells nothing of either."""
    return hmac.new(key, b"evoenv stream key id", hashlib.sha256).hexdigest()[:8]
