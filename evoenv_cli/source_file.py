"""Reading an environment file named on the command line (`validate`, `sample`, `pool add`)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from shared.errors import UsageError

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
_CHUNK = 1 << 16


def read_source(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the regular file at `path`; `UsageError` if it is none.

    The path's type is checked first: anything but a regular file (missing, a directory, a
    FIFO, a device, a socket) or a file that cannot be opened (no permission) is a usage error,
    one line and exit 2. A FIFO is never opened, so nothing blocks waiting for a writer. A
    regular file is read up to `limit` plus one byte, however large it is: a file over the
    limit is still a candidate that fails L1 (the extra byte shows it is too large), and no
    more than that is ever held in memory or sent to a queue.
    """
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
    except OSError as exc:
        raise UsageError(_cannot_read(path, exc)) from exc
    if kind != stat.S_IFREG:
        raise UsageError(_not_a_file(path, kind))
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the check, opening it cannot hang.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(_cannot_read(path, exc)) from exc
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            raise UsageError(_not_a_file(path, kind))
        return _read_at_most(fd, limit + 1, path)
    finally:
        os.close(fd)


def source_text(path: Path, data: bytes, limit: int) -> str:
    """The text of a file read by `read_source`; `UsageError` if too large or not UTF-8."""
    if len(data) > limit:
        raise UsageError(
            f"{path} is larger than {limit} bytes, the limit of an environment file "
            "(EVOENV_VALIDATION__MAX_SOURCE_BYTES)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from exc


def _read_at_most(fd: int, size: int, path: Path) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        try:
            chunk = os.read(fd, min(left, _CHUNK))
        except OSError as exc:
            raise UsageError(_cannot_read(path, exc)) from exc
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _not_a_file(path: Path, kind: int) -> str:
    return f"{path} is {_KINDS.get(kind, 'not a regular file')}, not an environment file"


def _cannot_read(path: Path, exc: OSError) -> str:
    if exc.errno in {errno.ENOENT, errno.ENOTDIR}:
        return f"{path}: no such file"
    if exc.errno in {errno.EACCES, errno.EPERM}:
        return f"{path}: permission denied"
    return f"{path}: cannot be read ({exc.strerror or exc})"
